"""TrainSettings.compile_whole_step: the whole training step as one XLA program gives today's step's numbers."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import FLOAT32_EPS, float32_tolerance

from bert_tf.configs import BertConfig
from bert_tf.models.pretrainer import BertPretrainer
from bert_tf.runners.pretraining import pretraining_loss_fn
from bert_tf.training import loop
from bert_tf.training import optimizer as optimizer_lib
from bert_tf.training.settings import TrainSettings
from bert_tf.training.strategy import get_strategy

B, S, P, STEPS = 4, 16, 3, 4
LEARNING_RATE = 1e-3
CONFIG = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=S)


def dataset_fn(ctx, batch_size):
    rng = np.random.default_rng(0)
    lengths = rng.integers(S // 2, S + 1, size=(STEPS * B,))
    mask = (np.arange(S)[None, :] < lengths[:, None]).astype(np.int32)
    features = dict(
        input_ids=rng.integers(5, 60, size=(STEPS * B, S)).astype(np.int32) * mask, input_mask=mask,
        segment_ids=np.zeros((STEPS * B, S), np.int32),
        masked_lm_positions=np.sort(np.stack([rng.choice(np.arange(1, n), P, replace=False) for n in lengths]), 1)
        .astype(np.int32),
        masked_lm_ids=rng.integers(5, 60, size=(STEPS * B, P)).astype(np.int32),
        masked_lm_weights=np.ones((STEPS * B, P), np.float32),
        next_sentence_labels=rng.integers(0, 2, size=(STEPS * B, 1)).astype(np.int32))
    return tf.data.Dataset.from_tensor_slices(features).repeat().batch(batch_size, drop_remainder=True)


def train(model_dir, start, **settings):
    """A run of STEPS steps from the weights and dropout seed states in `start` (filled by the first run:
    two models built in one process are not initialised alike)."""

    def init_fn(model):
        if not start:
            start.extend(v.numpy() for v in model.variables)
        for v, value in zip(model.variables, start, strict=True):
            v.assign(value)

    trainer = loop.Trainer(
        get_strategy("one_device"),
        TrainSettings(iterations_per_loop=2, save_checkpoints_steps=100, jit_compile=True, **settings),
        lambda: BertPretrainer(CONFIG, skip_padding=False), pretraining_loss_fn,
        lambda v: optimizer_lib.create_optimizer("adamw", v, LEARNING_RATE, STEPS, 1), model_dir=model_dir,
        train_steps=STEPS, global_batch_size=B, checkpoint_input_pipeline=False, init_fn=init_fn)
    trainer.train(dataset_fn)
    return trainer


@pytest.mark.slow  # two XLA compilations of a 1-layer pretrainer's step (~40 s on 2 cores)
def test_whole_step_gives_the_same_weights_as_todays_step(tmp_path):
    start = []
    runs = [train(str(tmp_path / str(whole)), start, compile_whole_step=whole) for whole in (False, True)]
    today, whole = runs
    assert whole.step.whole_step_fn is not None and today.step.whole_step_fn is None
    assert int(whole.global_step.numpy()) == STEPS
    # The first step's loss bit for bit (the same weights, the same forward pass and loss); the later ones from
    # weights that differ by float32 rounding (below), so to a few ulps: seen 1e-7 relative at step 4.
    assert whole.step_losses[0] == today.step_losses[0]
    np.testing.assert_allclose(whole.step_losses, today.step_losses, rtol=8 * FLOAT32_EPS, atol=0)
    # The weights to float32 rounding: in one program XLA fuses across what were program boundaries (the
    # gradients' last ops with the update), which can round differently (a multiply-add contracted, a sum
    # in another order). Seen on CPU: most variables differ in some elements, by 4e-9 at most.
    update_size = LEARNING_RATE * STEPS * 1.1  # Adam's step is at most ~lr a step, plus weight decay
    tolerance = float32_tolerance(update_size, B * S * STEPS)
    for a, b in zip(today.model.trainable_variables, whole.model.trainable_variables, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=4 * FLOAT32_EPS, atol=tolerance, err_msg=a.path)
    assert any(np.any(v.numpy() != s) for v, s in zip(whole.model.variables, start, strict=True))  # it trained
    keras.backend.clear_session()


def test_whole_step_needs_xla_and_one_device(tmp_path):
    with pytest.raises(ValueError, match="whole_step compiles the step with XLA: it needs jit_compile"):
        loop.Trainer(get_strategy("one_device"), TrainSettings(compile_whole_step=True),
                     lambda: BertPretrainer(CONFIG, skip_padding=False), pretraining_loss_fn,
                     lambda v: optimizer_lib.create_optimizer("adamw", v, 1e-3, STEPS, 1), model_dir=str(tmp_path),
                     train_steps=STEPS, global_batch_size=B, checkpoint_input_pipeline=False)


@pytest.mark.half_precision
def test_whole_step_with_float16_loss_scaling_matches_todays_step(tmp_path):
    """The loss-scale update (a merge_call) compiles into the one program too: on the toy regression of
    test_training_loop.py the first step overflows and halves the scale in both, and the runs agree."""
    from test_training_loop import dataset_fn as toy_data
    from test_training_loop import make_trainer

    runs = []
    for whole in (False, True):
        trainer = make_trainer(str(tmp_path / str(whole)), mixed_precision="float16", steps=6, jit_compile=True,
                               compile_whole_step=whole)
        trainer.train(toy_data)
        runs.append(trainer)
    today, whole = runs
    assert whole.step_losses == today.step_losses
    assert float(whole.loss_scale.scale.numpy()) == float(today.loss_scale.scale.numpy()) < 2.0**15
    for a, b in zip(today.model.trainable_variables, whole.model.trainable_variables, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=4 * FLOAT32_EPS, atol=float32_tolerance(0.05 * 6, 16 * 6))
