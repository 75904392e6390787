"""TrainSettings.steps_per_program: K whole steps in one compiled program give the numbers of K programs of one step."""

import dataclasses

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
from bert_tf.training.host_calls import CallSizer
from bert_tf.training.settings import TrainSettings
from bert_tf.training.strategy import get_strategy

B, S, P, STEPS, K = 4, 16, 3, 8, 4
LEARNING_RATE = 1e-3
CONFIG = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=S, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def dataset_fn(ctx, batch_size):
    """STEPS x 2 batches of distinct synthetic pretraining examples (every step of a run sees new ones)."""
    n = STEPS * 2 * B
    rng = np.random.default_rng(0)
    lengths = rng.integers(S // 2, S + 1, size=(n,))
    mask = (np.arange(S)[None, :] < lengths[:, None]).astype(np.int32)
    features = dict(
        input_ids=rng.integers(5, 60, size=(n, S)).astype(np.int32) * mask, input_mask=mask,
        segment_ids=np.zeros((n, S), np.int32),
        masked_lm_positions=np.sort(np.stack([rng.choice(np.arange(1, m), P, replace=False) for m in lengths]), 1)
        .astype(np.int32),
        masked_lm_ids=rng.integers(5, 60, size=(n, P)).astype(np.int32),
        masked_lm_weights=np.ones((n, P), np.float32),
        next_sentence_labels=rng.integers(0, 2, size=(n, 1)).astype(np.int32))
    return tf.data.Dataset.from_tensor_slices(features).repeat().batch(batch_size, drop_remainder=True)


@pytest.fixture(scope="module")
def start():
    """The weights and dropout seed states every run starts from (filled by the first run: two models built
    in one process are not initialised alike)."""
    return {}


def train(model_dir, start, config=CONFIG, train_steps=STEPS, **settings):
    def init_fn(model):
        values = start.setdefault(config, [v.numpy() for v in model.variables])
        for v, value in zip(model.variables, values, strict=True):
            v.assign(value)

    settings = dict(dict(iterations_per_loop=K, save_checkpoints_steps=K, jit_compile=True, compile_whole_step=True),
                    **settings)
    trainer = loop.Trainer(
        get_strategy("one_device"), TrainSettings(**settings), lambda: BertPretrainer(config, skip_padding=False),
        pretraining_loss_fn, lambda v: optimizer_lib.create_optimizer("adamw", v, LEARNING_RATE, STEPS, 2),
        model_dir=model_dir, train_steps=train_steps, global_batch_size=B, init_fn=init_fn)
    trainer.train(dataset_fn)
    return trainer


def assert_same_run(one, many, steps=STEPS):
    """The per-step losses and the final weights, optimizer slots and seed states to float32 rounding: the
    K-step program's body is the whole step itself, but XLA may fuse (and so round) it otherwise inside a loop.
    (Seen on CPU, TensorFlow 2.20: bit for bit, with and without dropout and gradient accumulation.)"""
    assert len(many.step_losses) == len(one.step_losses) == steps
    np.testing.assert_allclose(many.step_losses, one.step_losses, rtol=16 * FLOAT32_EPS, atol=0)
    assert int(many.global_step.numpy()) == int(one.global_step.numpy()) == steps
    tolerance = float32_tolerance(LEARNING_RATE * steps * 1.1, B * S * steps)  # Adam moves ~lr a step at most
    for a, b in zip(one.model.variables, many.model.variables, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=4 * FLOAT32_EPS, atol=tolerance, err_msg=a.path)
    # Adam's first moments: a skipped or repeated update would move them by ~(1 - beta_1) = 10% of their size.
    # Rounding (a sum in another order, e.g. under load on CPU) moved one element by 5e-7 of the largest moment,
    # and the moments of gradients that are zero but for rounding (1e-14) anywhere: a tolerance on the scale of
    # all moments, not of each slot's own.
    largest = max(np.abs(m.numpy()).max() for m in one.optimizer.slots["m"])
    for a, b in zip(one.optimizer.slots["m"], many.optimizer.slots["m"], strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=64 * FLOAT32_EPS, atol=1e-5 * largest, err_msg=a.name)


@pytest.mark.slow  # three XLA compilations of a 1-layer pretrainer's step (~1 min on 2 cores)
def test_k_steps_per_program_with_dropout_and_resume(tmp_path, start):
    one = train(str(tmp_path / "k1"), start)
    many = train(str(tmp_path / "k4"), start, steps_per_program=K)
    assert many.step.program_fn is not None and one.step.program_fn is None
    # One program per K steps: the first host call's compiling program, then one call of one program.
    assert [(r["step"], r["steps"]) for r in many.loop_history] == [(4, 4), (8, 4)]
    assert_same_run(one, many)
    # Dropout drew its masks from seed states that advanced per inner step, as in K programs of one step.
    seeds = {v.path: (v.numpy(), s) for v, s in zip(many.model.variables, start[CONFIG], strict=True)
             if "seed_generator" in v.path}
    assert seeds and all(not np.array_equal(now, then) for now, then in seeds.values())
    # Resumed at step 4 (a checkpoint at a multiple of K, with its input position): the same run.
    resumed_dir = str(tmp_path / "resumed")
    first = train(resumed_dir, start, train_steps=K, steps_per_program=K)
    keras.backend.clear_session()
    second = train(resumed_dir, start, steps_per_program=K)
    second.step_losses[:0] = first.step_losses
    assert_same_run(one, second)
    keras.backend.clear_session()


@pytest.mark.slow  # two XLA compilations (~40 s on 2 cores)
def test_k_steps_per_program_without_dropout_with_gradient_accumulation(tmp_path, start):
    config = dataclasses.replace(CONFIG, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    one = train(str(tmp_path / "k1"), start, config=config, gradient_accumulation_steps=2)
    many = train(str(tmp_path / "k4"), start, config=config, gradient_accumulation_steps=2, steps_per_program=K)
    assert_same_run(one, many)
    keras.backend.clear_session()


@pytest.mark.half_precision
def test_k_steps_per_program_with_float16_loss_scaling(tmp_path):
    """The loss scale advances per inner step: on the toy regression of test_training_loop.py the first step
    overflows and halves the scale, in one program as in K."""
    from test_training_loop import dataset_fn as toy_data
    from test_training_loop import make_trainer

    runs = []
    for k in (1, 2):
        trainer = make_trainer(str(tmp_path / str(k)), mixed_precision="float16", steps=6, jit_compile=True,
                               compile_whole_step=True, steps_per_program=k, iterations_per_loop=2)
        trainer.train(toy_data)
        runs.append(trainer)
    one, many = runs
    np.testing.assert_allclose(many.step_losses, one.step_losses, rtol=16 * FLOAT32_EPS, atol=0)
    assert float(many.loss_scale.scale.numpy()) == float(one.loss_scale.scale.numpy()) < 2.0**15
    assert int(many.loss_scale.good_steps.numpy()) == int(one.loss_scale.good_steps.numpy())
    for a, b in zip(one.model.trainable_variables, many.model.trainable_variables, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=4 * FLOAT32_EPS, atol=float32_tolerance(0.05 * 6, 16 * 6))


@pytest.mark.parametrize("settings, message", [
    (dict(steps_per_program=0), "steps_per_program must be positive, got 0"),
    (dict(steps_per_program=4, compile_whole_step=True, iterations_per_loop=6),
     "iterations_per_loop 6 must be a multiple of steps_per_program 4"),
    (dict(steps_per_program=4, compile_whole_step=True, save_checkpoints_steps=10),
     "save_checkpoints_steps 10 must be a multiple of steps_per_program 4"),
    (dict(steps_per_program=4, compile_whole_step=True, save_checkpoints_steps=8, profile_steps=(4, 8)),
     r"profile_steps 4,8 must cover whole programs of steps_per_program 4 steps \(N - 1 and M multiples of 4\)"),
])
def test_settings_refuse_what_k_step_programs_cannot_run(settings, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        TrainSettings(**settings).check()


def test_settings_accept_whole_programs_and_validate_the_run_steps():
    settings = TrainSettings(steps_per_program=4, compile_whole_step=True, save_checkpoints_steps=8,
                             iterations_per_loop=8, profile_steps=(5, 12))
    settings.check()
    settings.validate(1, train_steps=16, global_batch_size=8)
    with pytest.raises(ValueError, match="^num_train_steps 10 must be a multiple of steps_per_program 4$"):
        settings.validate(1, train_steps=10, global_batch_size=8)
    # The whole step is decided with the strategy (bert_setup), after check(): validate() asks for it.
    TrainSettings(steps_per_program=4, jit_compile=True, save_checkpoints_steps=8).check()
    with pytest.raises(ValueError, match="^steps_per_program 4 runs whole steps in one XLA program: it needs "
                                         "compile_whole_step$"):
        TrainSettings(steps_per_program=4, jit_compile=True).validate(1, train_steps=8, global_batch_size=8)


def test_automatic_host_calls_run_whole_programs():
    sizer = CallSizer(None, total_steps=1000, multiple=8)
    assert sizer.steps(0) == 16  # two programs: the first compiles, the second measures
    sizer.observe(16, 8, 8 * 0.01)
    assert sizer.steps(16) == 84 // 8 * 8  # up to the tenth at step 100, rounded down to whole programs
    assert sizer.steps(96) == 8  # 4 steps to the tenth: one program, past the mark
    sizer.observe(80, 80, 80 * 0.5)  # 0.5 s a step: 60 steps in 30 s
    assert sizer.steps(104) == 56
    assert CallSizer(None, total_steps=1000).steps(0) == 2  # K = 1 as before
