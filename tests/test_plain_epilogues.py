"""plain_epilogues (a GPU candidate): the blocks' bias+GELU, dropout+add and LayerNorm as plain ops with
TensorFlow's own gradients, so XLA's cuBLASLt bias+GELU epilogue and cuDNN LayerNorm can match them. On a
CPU: the same losses and gradients as the fused custom-gradient kernels, and none of those kernels traced."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_tf.configs import BertConfig
from bert_tf.models.encoder import BertEncoder
from bert_tf.models.pretrainer import BertPretrainer
from bert_tf.training.step import dtype_policy

CONFIG = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=16)
B, S, P = 3, 16, 3


def batch():
    rng = np.random.default_rng(0)
    lengths = np.array([16, 11, 7])
    mask = (np.arange(S)[None] < lengths[:, None]).astype(np.int32)
    return dict(input_ids=tf.constant(rng.integers(5, 60, (B, S)) * mask, tf.int32), input_mask=tf.constant(mask),
                segment_ids=tf.constant((np.arange(S)[None] >= lengths[:, None] // 2) * mask, tf.int32),
                masked_lm_positions=tf.constant([[1, 5, 9], [2, 3, 8], [1, 4, 5]], tf.int32),
                masked_lm_ids=tf.constant(rng.integers(5, 60, (B, P)), tf.int32),
                masked_lm_weights=tf.constant([[1.0] * P, [1.0] * P, [1.0, 1.0, 0.0]]),
                next_sentence_labels=tf.constant([[0], [1], [0]], tf.int32))


def losses_and_grads(plain, precision, steps=2):
    """Two training calls (dropout on: each draws new masks) of a freshly seeded model -> [(loss, grads)]."""
    keras.utils.set_random_seed(7)
    with dtype_policy(precision):
        model = BertPretrainer(CONFIG, encoder=BertEncoder(CONFIG, plain_epilogues=plain), skip_padding=False)
        model(batch(), training=False)

    @tf.function(autograph=False)
    def step(features):
        with tf.GradientTape() as tape:
            loss = model(features, training=True)["loss"]
        return loss, tape.gradient(loss, model.trainable_variables)

    out = [step(batch()) for _ in range(steps)]
    traced = {f.signature.name for f in step.get_concrete_function(batch()).graph.as_graph_def().library.function}
    return [(float(loss), [tf.convert_to_tensor(g).numpy().astype(np.float32) for g in grads]) for loss, grads in out], traced, model


@pytest.mark.parametrize("precision, rtol", [("float32", 2e-5),
                                             pytest.param("bfloat16", 2e-2, marks=pytest.mark.half_precision)])
def test_plain_epilogues_give_the_fused_kernels_losses_and_gradients(precision, rtol):
    fused, fused_traced, _ = losses_and_grads(False, precision)
    plain, plain_traced, model = losses_and_grads(True, precision)
    for (loss_f, grads_f), (loss_p, grads_p) in zip(fused, plain, strict=True):
        assert loss_p == pytest.approx(loss_f, rel=rtol)
        for gf, gp in zip(grads_f, grads_p, strict=True):
            np.testing.assert_allclose(gp, gf, rtol=rtol, atol=rtol * max(1e-3, float(np.abs(gf).max())))
    assert fused[0][0] != fused[1][0]  # the second call drew other dropout masks (in both)
    fused_kernels = ("_bias_gelu_forward", "_dropout_add_norm_forward", "_bias_gelu_grad", "_dropout_add_norm_grad")
    assert all(any(k in name for name in fused_traced) for k in fused_kernels)
    # plain: none of the blocks' fused kernels (the embeddings' LayerNorm keeps its own)
    assert not any(k in name for k in fused_kernels for name in plain_traced)
    assert BertEncoder.from_config(model.encoder.get_config()).plain_epilogues is True
