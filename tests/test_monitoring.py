"""What a run shows in TensorBoard, unit by unit (tests/test_tensorboard.py reads it through a real server)."""

import dataclasses
import re

import pytest

from bert_tf.runners import common
from bert_tf.runners.task import FinetuneConfig


@dataclasses.dataclass
class _Task:
    eval_splits: tuple = ("dev",)


@pytest.mark.parametrize("kwargs, expected", [
    (dict(do_train=True, do_eval=True), 6),  # default: one epoch's whole batches (50 // 8)
    (dict(do_train=True, do_eval=True, eval_every_steps=4), 4),
    (dict(do_train=True, do_eval=True, eval_every_steps=0), 0),  # 0: only at the end
    (dict(do_train=True), 0),  # no --do_eval: no evaluation unless asked for
    (dict(do_train=True, eval_every_steps=5), 5),
    (dict(do_eval=True), 0),  # nothing trains
])
def test_eval_interval_defaults_to_each_epoch_with_do_eval(kwargs, expected):
    cfg = FinetuneConfig(output_dir="unused", train_batch_size=8, **kwargs)
    assert common.eval_interval(cfg, _Task(), train_units=50) == expected
    assert common.eval_interval(cfg, _Task(eval_splits=()), train_units=50) == 0
    if expected and "eval_every_steps" not in kwargs:
        assert common.eval_interval(cfg, _Task(), train_units=3) == 1  # fewer examples than a batch


def test_eval_tags_are_the_training_tags():
    assert [common.summary_tag(k) for k in ("eval_accuracy", "eval_loss", "eval_f1", "f1", "exact", "loss")] == \
        ["accuracy", "loss", "f1", "f1", "exact", "loss"]


def _events(folder):
    """{tag: {step: value}} of the scalar summaries in an event folder."""
    import os

    import tensorflow as tf

    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.startswith("events.out"):
            continue
        for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "scalars":
                    out.setdefault(v.tag, {})[event.step] = float(tf.make_ndarray(v.tensor))
    return out


def _masked_trainer(model_dir, delay, train_steps=4, **settings):
    """A toy Trainer whose batches hold an input_mask with 3 of every 8 positions real; each batch
    takes `delay` seconds to make (a slow input pipeline)."""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    from bert_tf.training import loop
    from bert_tf.training import optimizer as opt
    from bert_tf.training import strategy as strategy_lib
    from bert_tf.training.settings import TrainSettings

    x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    mask = np.zeros((64, 8), np.int32)
    mask[:, :3] = 1

    def slow(batch):
        def sleep(t):
            time.sleep(delay)
            return t

        batch["x"] = tf.py_function(sleep, [batch["x"]], tf.float32)
        batch["x"].set_shape([None, 8])
        return batch

    def dataset_fn(ctx, batch_size):
        ds = tf.data.Dataset.from_tensor_slices({"x": x, "input_mask": mask}).repeat().batch(batch_size)
        # No batch made ahead (tf.data would inject a prefetch after the map): every batch is waited for.
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        return (ds.map(slow) if delay else ds).with_options(options)

    def model_fn():
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])

    def loss_fn(model, batch, training):
        masked = batch["x"] * tf.cast(batch["input_mask"], tf.float32)
        return tf.reduce_mean(tf.square(model(masked, training=training))), {}

    trainer = loop.Trainer(strategy_lib.get_strategy("one_device"),
                           TrainSettings(iterations_per_loop=2, save_checkpoints_steps=train_steps, **settings),
                           model_fn, loss_fn, lambda v: opt.create_optimizer("adamw", v, 0.01, train_steps, 0),
                           model_dir=str(model_dir), train_steps=train_steps, global_batch_size=4,
                           checkpoint_input_pipeline=False)  # (a py_function cannot be saved)
    return trainer, dataset_fn


def test_speed_and_input_scalars_split_waiting_from_computing(tmp_path):
    """A pipeline that takes 0.2 s per batch: the loop's wait for input is that, the rest computing;
    3 of 8 positions real; examples/s per replica = examples/s on one device."""
    trainer, dataset_fn = _masked_trainer(tmp_path / "slow", delay=0.2)
    trainer.train(dataset_fn)
    events = _events(str(tmp_path / "slow" / "train"))
    assert set(events["speed/seconds_per_step"]) == {2, 4}  # one point per logged loop
    assert events["input/real_tokens_per_position"] == {2: 3 / 8, 4: 3 / 8}
    assert events["speed/examples_per_second_per_replica"] == events["examples_per_second"]
    step4 = {tag: values[4] for tag, values in events.items() if 4 in values}  # the second loop: no compiling
    # Nothing makes the batch ahead, so each step waits for all of its 0.2 s.
    assert step4["speed/input_wait_seconds_per_step"] >= 0.19
    assert step4["speed/input_wait_fraction"] == pytest.approx(
        step4["speed/input_wait_seconds_per_step"] / step4["speed/seconds_per_step"], rel=1e-5)
    assert step4["speed/input_wait_seconds_per_step"] + step4["speed/compute_seconds_per_step"] == \
        pytest.approx(step4["speed/seconds_per_step"], rel=1e-5)
    # The same run without the delay waits far less (a bound loose enough for a machine shared with others).
    fast, fast_fn = _masked_trainer(tmp_path / "fast", delay=0)
    fast.train(fast_fn)
    fast_wait = _events(str(tmp_path / "fast" / "train"))["speed/input_wait_seconds_per_step"][4]
    assert fast_wait < step4["speed/input_wait_seconds_per_step"] / 2


def test_the_first_step_compiles_apart_from_the_speed_and_eta(tmp_path, caplog):
    """The first host loop of a process runs its first step alone (tracing and compiling: XLA takes
    tens of seconds on a GPU) and reports that time beside the loop, not inside examples/s or the ETA;
    the loop's losses and metrics still cover all of its steps. Same for the first eval batch."""
    import logging

    caplog.set_level(logging.INFO, "bert_tf.training")
    trainer, dataset_fn = _masked_trainer(tmp_path, delay=0.2)
    trainer.train(dataset_fn)
    first, second = trainer.loop_history
    assert first["steps"] == 2 and len(trainer.step_losses) == 4
    assert first["compile_seconds"] >= 0.2 and second["compile_seconds"] == 0.0
    events = _events(str(tmp_path / "train"))
    assert set(events["speed/first_step_seconds"]) == {2}
    assert events["speed/first_step_seconds"][2] == pytest.approx(first["compile_seconds"])
    # The first loop's speed counts its second step only: one 0.2 s wait for its one batch of 4.
    assert events["speed/seconds_per_step"][2] == pytest.approx(first["seconds"])
    assert events["examples_per_second"][2] == pytest.approx(4 / first["seconds"])
    assert 0.19 <= first["seconds"] < first["compile_seconds"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert re.fullmatch(r"step 2/4 loss \S+ +lr \S+ grad_norm \S+ [\d.]+ examples/s ETA \S+ "
                        r"\(first step [\d.]+ s: tracing and compiling, not counted\)", lines[0]), lines[0]
    assert re.fullmatch(r"step 4/4 .* [\d.]+ examples/s ETA 0h00m00s", lines[1]), lines[1]
    trainer.evaluate(dataset_fn, 4, steps=3)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval ")]
    assert re.match(r"eval at step 4 over 3 batches \([\d.]+ examples/s; first batch [\d.]+ s with tracing "
                    r"and compiling\): loss ", line), line


def test_the_eta_after_a_compiling_loop_counts_the_steps_still_to_run(tmp_path, caplog):
    """10 steps left after a first loop whose one timed step waited 0.25 s for its batch: an ETA of about
    2.5 s, not 0 (the clock of the steps after the first step starts where that step ended)."""
    import logging

    caplog.set_level(logging.INFO, "bert_tf.training")
    trainer, dataset_fn = _masked_trainer(tmp_path, delay=0.25, train_steps=12)
    trainer.train(dataset_fn)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    eta = re.search(r" ETA 0h00m(\d\d)s ", lines[0])
    assert lines[0].startswith("step 2/12 ") and eta and 2 <= int(eta.group(1)) <= 9, lines[0]


def test_hparams_are_written_as_a_session_of_model_dir(tmp_path):
    import os

    import tensorflow as tf
    from tensorboard.plugins.hparams import metadata

    trainer, _ = _masked_trainer(tmp_path, delay=0, learning_rate=0.003, mixed_precision="float32")
    trainer.write_hparams({"max_seq_length": 8, "pack_sequences": False, "task": "toy", "odd": (1, 2)})
    [name] = [n for n in os.listdir(tmp_path) if n.startswith("events.out")]
    infos = [metadata.parse_session_start_info_plugin_data(v.metadata.plugin_data.content)
             for e in tf.compat.v1.train.summary_iterator(str(tmp_path / name)) for v in e.summary.value
             if v.tag == metadata.SESSION_START_INFO_TAG]
    assert len(infos) == 1
    values = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in infos[0].hparams.items()}
    assert values["learning_rate"] == pytest.approx(0.003) and values["optimizer"] == "adamw"
    assert values["train_batch_size"] == 4 and values["train_steps"] == 4 and values["precision"] == "float32"
    assert values["max_seq_length"] == 8 and values["pack_sequences"] is False and values["task"] == "toy"
    assert values["parameters"] == 9 and values["odd"] == "(1, 2)"  # Dense(8 -> 1); other types as text
    # --overwrite_output_dir removes them with the rest of the run.
    from bert_tf.model_dir import clear_model_dir

    clear_model_dir(str(tmp_path))
    assert not [n for n in os.listdir(tmp_path) if n.startswith("events.out")]


def test_profile_steps_capture_exactly_those_steps(tmp_path, caplog):
    import glob
    import logging

    caplog.set_level(logging.INFO, "bert_tf.training")
    trainer, dataset_fn = _masked_trainer(tmp_path, delay=0, profile_steps=(2, 3))
    trainer.train(dataset_fn)
    # Loops end at step 1 (before the capture) and 3 (its end), then go on as configured.
    assert [h["step"] for h in trainer.loop_history] == [1, 3, 4]
    assert "profiling steps 2-3 into" in caplog.text
    [trace] = glob.glob(str(tmp_path / "train" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert __import__("os").path.getsize(trace) > 0


def test_without_the_input_wait_clock_the_steps_are_the_same_and_the_wait_is_not_reported(tmp_path):
    """TrainSettings.input_wait_clock=False (the GPU candidate +noclock), and with device_input (+devfeed):
    the same losses step for step as with the clock, TensorBoard has the speed but no input-wait scalars (not measured, not a 0)."""
    import numpy as np

    trained = []
    for name, settings in (("clocked", {}), ("free", {"input_wait_clock": False}),
                           ("devfed", {"input_wait_clock": False, "device_input": True})):
        trainer, dataset_fn = _masked_trainer(tmp_path / name, delay=0, **settings)
        trainer.model.set_weights([np.full(w.shape, 0.1, w.dtype) for w in trainer.model.get_weights()])
        trainer.train(dataset_fn)
        trained.append(trainer)
    clocked, free, devfed = trained
    np.testing.assert_array_equal(free.step_losses, clocked.step_losses)
    # batches through tf.distribute's device-fetching input (TrainSettings.device_input): the same steps
    np.testing.assert_array_equal(devfed.step_losses, clocked.step_losses)
    # unset, the clock is on where the step runs on the CPU; the run summary says which and why
    assert clocked.input_wait_clock is True and free.input_wait_clock is False
    assert "input-wait clock: on (the default on the CPU)" in clocked.run_summary()
    assert "input-wait clock: off (set)" in free.run_summary()
    assert len(free.step_losses) == 4
    events = _events(str(tmp_path / "free" / "train"))
    assert set(events["speed/seconds_per_step"]) == {2, 4} and events["input/real_tokens_per_position"][4] == 3 / 8
    assert not any(tag.startswith("speed/input_wait") or tag == "speed/compute_seconds_per_step" for tag in events)


def test_the_input_wait_clock_is_off_by_default_where_replicas_run_on_a_gpu_or_tpu():
    from types import SimpleNamespace

    from bert_tf.training.strategy import get_strategy, on_accelerator

    def devices(*names):
        return SimpleNamespace(extended=SimpleNamespace(worker_devices=names))

    assert on_accelerator(devices("/job:localhost/replica:0/task:0/device:GPU:0"))
    assert on_accelerator(devices("/job:worker/replica:0/task:0/device:TPU:0", "/job:worker/task:0/device:TPU:1"))
    assert not on_accelerator(devices("/job:localhost/replica:0/task:0/device:CPU:0"))
    assert not on_accelerator(get_strategy("one_device"))  # this machine has no GPU
