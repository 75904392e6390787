"""The Keras BERT encoder: shapes, masking, original numerics, XLA, mixed precision, and the tf-models oracle."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import float32_tolerance

from bert_tf.configs import BertConfig
from bert_tf.layers import gelu
from bert_tf.models import BertEncoder

CONFIG = BertConfig(
    vocab_size=40,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=32,
    max_position_embeddings=24,
    type_vocab_size=2,
)


def make_inputs(batch=3, seq=10, seed=0, pad_from=None):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, CONFIG.vocab_size, (batch, seq)).astype("int32")
    mask = np.ones((batch, seq), "int32")
    segments = np.zeros((batch, seq), "int32")
    segments[:, seq // 2 :] = 1
    if pad_from is not None:
        mask[:, pad_from:] = 0
        ids[:, pad_from:] = 0
        segments[:, pad_from:] = 0
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def randomize(model, seed=1, scale=0.5):
    """Non-trivial weights everywhere (biases and LayerNorm included) so every path is exercised."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0.0, scale, v.shape).astype("float32") + (1.0 if v.path.endswith("gamma") else 0.0))


@pytest.fixture(scope="module")
def encoder():
    model = BertEncoder(CONFIG)
    randomize(model)
    return model


@pytest.fixture
def policy():
    """Sets a global Keras dtype policy for one test and always restores float32."""
    previous = keras.config.dtype_policy()
    yield keras.mixed_precision.set_dtype_policy
    keras.mixed_precision.set_dtype_policy(previous)


def test_outputs_and_shapes(encoder):
    for seq in (1, 7, CONFIG.max_position_embeddings):
        out = encoder(make_inputs(batch=2, seq=seq))
        assert out["sequence_output"].shape == (2, seq, CONFIG.hidden_size)
        assert out["pooled_output"].shape == (2, CONFIG.hidden_size)
        assert len(out["encoder_outputs"]) == CONFIG.num_hidden_layers
        np.testing.assert_array_equal(out["encoder_outputs"][-1], out["sequence_output"])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        encoder(make_inputs(batch=1, seq=CONFIG.max_position_embeddings + 1))


def test_layer_and_variable_names_are_stable(encoder):
    paths = [v.path for v in encoder.weights]
    assert "bert/embeddings/word_embeddings/embeddings" in paths
    assert "bert/layer_1/attention/query/kernel" in paths
    assert "bert/pooler/kernel" in paths
    assert len(paths) == len(set(paths)) == 5 + 16 * CONFIG.num_hidden_layers + 2


def test_padding_does_not_change_real_positions(encoder):
    short = make_inputs(batch=2, seq=6)
    padded = {k: np.pad(v, ((0, 0), (0, 4))) for k, v in short.items()}
    a = encoder(short)
    b = encoder(padded)
    np.testing.assert_allclose(b["sequence_output"][:, :6], a["sequence_output"], atol=1e-5)
    np.testing.assert_allclose(b["pooled_output"], a["pooled_output"], atol=1e-5)


def _ragged_inputs():
    x = make_inputs(batch=3, seq=12)
    lengths = np.array([12, 7, 3])
    mask = (np.arange(12)[None, :] < lengths[:, None]).astype("int32")
    return {k: v * mask for k, v in x.items()} | {"input_mask": mask}, mask


def test_skip_padding_and_output_positions_keep_the_computed_outputs(encoder):
    x, mask = _ragged_inputs()
    full = encoder(x)
    packed = encoder.real_token_outputs(x)
    real = mask[..., None].astype(bool)
    np.testing.assert_allclose(np.where(real, packed["sequence_output"], 0), np.where(real, full["sequence_output"], 0),
                               atol=1e-5)
    assert np.abs(np.where(real, 0, packed["sequence_output"])).max() == 0  # padding is not computed
    assert np.abs(np.where(real, 0, full["sequence_output"])).max() > 1e-3
    np.testing.assert_allclose(packed["pooled_output"], full["pooled_output"], atol=1e-5)
    positions = np.array([[1, 5, 11], [2, 6, 0], [1, 2, 0]], "int32")
    expected = np.take_along_axis(full["sequence_output"].numpy(), positions[..., None], axis=1)
    for skip in (False, True):
        out = encoder.outputs_at(x, positions, skip_padding=skip)
        assert set(out) == {"pooled_output", "position_output"}
        np.testing.assert_allclose(out["position_output"], expected, atol=1e-5)
        np.testing.assert_allclose(out["pooled_output"], full["pooled_output"], atol=1e-5)
        np.testing.assert_allclose(encoder.pooled_output(x, skip_padding=skip), full["pooled_output"], atol=1e-5)


def test_skip_padding_gradients_match(encoder):
    x, mask = _ragged_inputs()
    positions = np.array([[1, 5, 11], [2, 6, 0], [1, 2, 0]], "int32")
    grads = []
    for run in (encoder, lambda inputs: encoder.outputs_at(inputs, positions, skip_padding=True)):
        with tf.GradientTape() as tape:
            out = run(x)
            if "position_output" in out:
                picked = out["position_output"]
            else:
                picked = tf.gather(out["sequence_output"], positions, batch_dims=1)
            loss = tf.reduce_sum(picked ** 2) + tf.reduce_sum(out["pooled_output"])
        grads.append(tape.gradient(loss, encoder.trainable_variables))
    for a, b, v in zip(*grads, encoder.trainable_variables, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(b), tf.convert_to_tensor(a), atol=1e-4, rtol=1e-4,
                                   err_msg=v.path)


def test_skip_padding_rounds_the_row_count_up_to_a_few_sizes():
    from bert_tf.layers.layout import TokenLayout

    _, mask = _ragged_inputs()  # 22 real positions of 3 * 12
    layout = TokenLayout.real_tokens(mask)
    index, owned = layout.index.numpy(), layout.owned.numpy()
    assert len(index) == 24 and (owned < 36).sum() == 22  # a multiple of 8; 2 spare rows
    assert list(index[owned == 36]) == list(np.flatnonzero(mask.reshape(-1) == 0)[:2])  # first padded positions
    np.testing.assert_array_equal(np.sort(index), index)
    counts = set()
    for real in range(1, 33):  # every count of real positions in a [4, 8] batch ([CLS] is always a row)
        m = (np.arange(32) < real).reshape(4, 8).astype("int32")
        m[:, 0] = 1
        layout = TokenLayout.real_tokens(m, buckets=4)
        rows, num_real = layout.index.shape[0], int((layout.owned.numpy() < 32).sum())
        assert num_real == m.sum() and rows == min(-(-num_real // 8) * 8, 32)
        counts.add(rows)
    assert counts == {8, 16, 24, 32}


def test_skip_padding_gradients_match_when_the_loss_reads_padding(encoder):
    """Padded outputs are constant zeros under skip_padding: a loss that reads them must put no gradient
    into the weights through them (nor through the spare rows that copy a padded position)."""
    x, mask = _ragged_inputs()
    weights = np.random.default_rng(3).normal(size=(3, 12, CONFIG.hidden_size)).astype("float32")
    grads = []
    for skip, w in ((False, weights * mask[..., None]), (True, weights)):
        with tf.GradientTape() as tape:
            run = encoder.real_token_outputs if skip else encoder
            loss = tf.reduce_sum(run(x)["sequence_output"] * w)
        grads.append(tape.gradient(loss, encoder.trainable_variables))
    for a, b, v in zip(*grads, encoder.trainable_variables, strict=True):
        assert (a is None) == (b is None) == v.path.startswith("bert/pooler"), v.path
        if a is not None:
            np.testing.assert_allclose(tf.convert_to_tensor(b), tf.convert_to_tensor(a), atol=1e-4, rtol=1e-4,
                                       err_msg=v.path)


def test_segments_and_positions_matter(encoder):
    x = make_inputs(batch=1, seq=8)
    base = encoder(x)["sequence_output"].numpy()
    flipped = dict(x, segment_ids=1 - x["segment_ids"])
    assert np.abs(encoder(flipped)["sequence_output"].numpy() - base).max() > 1e-3
    # Same token everywhere: outputs still differ by position because of position embeddings.
    same = dict(x, input_ids=np.full_like(x["input_ids"], 5), segment_ids=np.zeros_like(x["segment_ids"]))
    seq = encoder(same)["sequence_output"].numpy()
    assert np.abs(seq[0, 0] - seq[0, 1]).max() > 1e-3


def test_dropout_only_in_training(encoder):
    x = make_inputs()
    np.testing.assert_array_equal(encoder(x)["sequence_output"], encoder(x)["sequence_output"])
    assert np.abs(encoder(x, training=True)["sequence_output"] - encoder(x)["sequence_output"]).max() > 1e-3


def test_gelu_is_the_tanh_approximation():
    x = np.linspace(-5, 5, 101).astype("float32")
    expected = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(gelu(x), expected, atol=1e-6)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    assert np.abs(np.asarray(gelu(x)) - exact).max() > 1e-4  # not the erf GELU


def test_gelu_gradient_matches_finite_differences():
    x64 = np.linspace(-6, 6, 2001)
    x = tf.constant(x64.astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = gelu(x)
    grad = tape.gradient(y, x).numpy()

    def reference(v):
        return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))

    numeric = (reference(x64 + 1e-5) - reference(x64 - 1e-5)) / 2e-5
    np.testing.assert_allclose(grad, numeric, atol=1e-5)
    assert grad.min() < -0.1 and grad.max() > 1.1  # the dip below 0 and the overshoot above 1


def test_layer_norm_matches_keras_values_and_gradients():
    from bert_tf.layers.normalization import LayerNorm

    rng = np.random.default_rng(0)
    layers = [keras.layers.LayerNormalization(epsilon=1e-12), LayerNorm(epsilon=1e-12)]
    gamma, beta = rng.normal(1, 0.3, 16).astype("float32"), rng.normal(0, 0.3, 16).astype("float32")
    for layer in layers:
        layer.build((None, 16))
        layer.gamma.assign(gamma)
        layer.beta.assign(beta)
    x = tf.constant(rng.normal(2, 3, (5, 7, 16)).astype("float32"))
    upstream = tf.constant(rng.normal(size=(5, 7, 16)).astype("float32"))
    results = []
    for layer in layers:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(y * upstream)
        results.append([y, *tape.gradient(loss, [x, layer.gamma, layer.beta])])
    for expected, got in zip(*results, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5)


def test_original_numerics_defaults():
    model = BertEncoder(CONFIG.replace(hidden_size=64, intermediate_size=128))
    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.LayerNormalization)]
    assert len(norms) == 1 + 2 * CONFIG.num_hidden_layers
    assert all(layer.epsilon == 1e-12 for layer in norms)
    for v in model.weights:
        values = v.numpy()
        if v.path.endswith("bias") or v.path.endswith("beta"):
            assert not values.any(), v.path
        elif v.path.endswith(("kernel", "embeddings")):
            # Truncated normal(0.02): within two standard deviations, std a bit below 0.02.
            assert np.abs(values).max() <= 0.04 + 1e-6, v.path
            if values.size > 1000:
                assert 0.015 < values.std() < 0.02, v.path


def test_attention_mask_bias_matches_a_numpy_reference():
    """One block, one head, computed by hand: scaled scores, -10000 on padding, softmax."""
    config = CONFIG.replace(num_hidden_layers=1, num_attention_heads=1, hidden_size=4, intermediate_size=8)
    model = BertEncoder(config)
    randomize(model, seed=3)
    x = make_inputs(batch=1, seq=5, pad_from=3)
    attention = model.blocks[0].attention
    h = model.embeddings(x["input_ids"], x["segment_ids"]).numpy()[0]
    q = h @ attention.query.kernel.numpy() + attention.query.bias.numpy()
    k = h @ attention.key.kernel.numpy() + attention.key.bias.numpy()
    v = h @ attention.value.kernel.numpy() + attention.value.bias.numpy()
    scores = q @ k.T / math.sqrt(4) + (1 - x["input_mask"][0])[None, :] * -10000.0
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = (probs @ v) @ attention.output_dense.kernel.numpy() + attention.output_dense.bias.numpy()
    got = attention(h[None], x["input_mask"]).numpy()[0]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_xla_matches_eager(encoder):
    x = make_inputs(batch=2, seq=12)
    eager = encoder(x)
    compiled = tf.function(lambda inputs: encoder(inputs), jit_compile=True)(x)
    # Same float32 math, reordered by the XLA compiler: float32 rounding only.
    np.testing.assert_allclose(compiled["sequence_output"], eager["sequence_output"], atol=1e-5)
    np.testing.assert_allclose(compiled["pooled_output"], eager["pooled_output"], atol=1e-5)


# Mixed precision tolerance: a bound in units of the format's rounding error u (bfloat16 keeps 8
# significant bits, u = 2^-8; float16 keeps 11, u = 2^-11). Each of the 2 blocks rounds its
# activations at ~8 sequential stages (embedding sum, Q/K/V, scores, context, attention output,
# residual, intermediate+GELU, output), each stage adding at most ~u * |x|; so we allow
# 16 * u * max|float32 output|. Measured on this test: ~4.4 u (bf16), ~9 u (fp16). A softmax or
# LayerNorm run in half precision with the -10000 bias, or a missed cast, is off by O(1).
ROUNDING_UNIT = {"mixed_bfloat16": 2.0**-8, "mixed_float16": 2.0**-11}
MIXED_STAGES = 16


@pytest.mark.half_precision
@pytest.mark.parametrize("policy_name", sorted(ROUNDING_UNIT))
def test_mixed_precision_matches_float32(encoder, policy, policy_name):
    x = make_inputs(batch=2, seq=12, pad_from=9)
    reference = encoder(x)
    policy(policy_name)
    mixed = BertEncoder(CONFIG)
    for ours, theirs in zip(mixed.weights, encoder.weights, strict=True):
        ours.assign(theirs)
    assert all(v.dtype == "float32" for v in mixed.weights)  # float32 master weights
    out = mixed(x)
    assert out["sequence_output"].dtype == policy_name.split("_")[1]
    tol = MIXED_STAGES * ROUNDING_UNIT[policy_name] * np.abs(reference["sequence_output"]).max()
    seq_err = np.abs(np.asarray(tf.cast(out["sequence_output"], tf.float32)) - reference["sequence_output"]).max()
    pool_err = np.abs(np.asarray(tf.cast(out["pooled_output"], tf.float32)) - reference["pooled_output"]).max()
    assert seq_err < tol and pool_err < tol, (seq_err, pool_err)
    # Softmax runs in float32: padded keys get exactly zero weight, so padding still has no effect.
    short = {k: v[:, :9] for k, v in x.items()}
    np.testing.assert_array_equal(
        np.asarray(mixed(short)["sequence_output"]), np.asarray(out["sequence_output"])[:, :9]
    )
    # And it compiles with XLA under the mixed policy.
    compiled = tf.function(lambda inputs: mixed(inputs), jit_compile=True)(x)
    assert (
        np.abs(np.asarray(tf.cast(compiled["sequence_output"], tf.float32)) - reference["sequence_output"]).max() < tol
    )


# ------------------------------------------------------------------ oracle: tf-models-official
def _tfm_to_tf1_name(name: str) -> str:
    """tf-models-official BertEncoder variable name -> original TF1 name (with its reshape done by the caller)."""
    name = name.split(":")[0]
    simple = {
        "word_embeddings/embeddings": "bert/embeddings/word_embeddings",
        "position_embedding/embeddings": "bert/embeddings/position_embeddings",
        "type_embeddings/embeddings": "bert/embeddings/token_type_embeddings",
        "embeddings/layer_norm/gamma": "bert/embeddings/LayerNorm/gamma",
        "embeddings/layer_norm/beta": "bert/embeddings/LayerNorm/beta",
        "pooler_transform/kernel": "bert/pooler/dense/kernel",
        "pooler_transform/bias": "bert/pooler/dense/bias",
    }
    if name in simple:
        return simple[name]
    _, layer, rest = name.split("/", 2)
    part = {
        "self_attention/query": "attention/self/query",
        "self_attention/key": "attention/self/key",
        "self_attention/value": "attention/self/value",
        "self_attention/attention_output": "attention/output/dense",
        "self_attention_layer_norm": "attention/output/LayerNorm",
        "intermediate": "intermediate/dense",
        "output": "output/dense",
        "output_layer_norm": "output/LayerNorm",
    }
    scope, leaf = rest.rsplit("/", 1)
    return f"bert/encoder/{layer}/{part[scope]}/{leaf}"


@pytest.mark.oracle
def test_matches_tf_models_official_bert_encoder(encoder):
    networks = pytest.importorskip("official.nlp.modeling.networks")
    tf_keras = pytest.importorskip("tf_keras")
    from bert_tf.checkpoints import tf1_variable_map

    theirs = networks.BertEncoder(
        vocab_size=CONFIG.vocab_size,
        hidden_size=CONFIG.hidden_size,
        num_layers=CONFIG.num_hidden_layers,
        num_attention_heads=CONFIG.num_attention_heads,
        max_sequence_length=CONFIG.max_position_embeddings,
        type_vocab_size=CONFIG.type_vocab_size,
        inner_dim=CONFIG.intermediate_size,
        inner_activation=lambda t: tf_keras.activations.gelu(t, approximate=True),
        dict_outputs=True,
    )
    ours = tf1_variable_map(encoder)
    assert len(theirs.weights) == len(ours)
    for variable in theirs.weights:
        value = ours[_tfm_to_tf1_name(variable.name)].numpy()
        variable.assign(value.reshape(variable.shape))  # EinsumDense [H, N, D] etc. are our [H, H] reshaped
    x = make_inputs(batch=3, seq=11, pad_from=8)
    expected = theirs(
        {"input_word_ids": x["input_ids"], "input_mask": x["input_mask"], "input_type_ids": x["segment_ids"]}
    )
    got = encoder(x)
    # Each layer sums H terms six times (q, k, v, attention output, FFN in, LayerNorm's mean and
    # variance... counted as 5), head_size for the scores, seq twice (softmax, context), intermediate
    # once: the same sums in another order give at most this (1.5e-4 here; measured about 1e-5 on
    # AVX-512 and on AMD Zen 3). Exact against tanh GELU comes out 12x the bound apart.
    chain = CONFIG.num_hidden_layers * (5 * CONFIG.hidden_size + CONFIG.hidden_size // CONFIG.num_attention_heads
                                        + 2 * x["input_ids"].shape[1] + CONFIG.intermediate_size)
    for a, b in zip([got["sequence_output"], got["pooled_output"], *got["encoder_outputs"]],
                    [expected["sequence_output"], expected["pooled_output"], *expected["encoder_outputs"]],
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=float32_tolerance(np.abs(b).max(), chain))
