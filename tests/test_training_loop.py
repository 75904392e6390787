"""The generic training loop on a toy regression model: resume, strategies, accumulation, failures."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from bert_tf.errors import ConfigError, TrainingError, TrainingPreempted
from bert_tf.training import loop
from bert_tf.training import optimizer as optimizer_lib
from bert_tf.training import strategy as strategy_lib
from bert_tf.training.settings import TrainSettings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The toy task, also run in subprocesses (TOY_SOURCE is executed there).
TOY_SOURCE = textwrap.dedent(
    """
    import numpy as np, tensorflow as tf, keras
    from bert_tf.training import loop, optimizer as opt, strategy as strategy_lib
    from bert_tf.training.settings import TrainSettings

    _rng = np.random.default_rng(0)
    X = _rng.normal(size=(512, 4)).astype(np.float32)
    Y = (X @ np.array([1.0, -2.0, 3.0, 0.5], np.float32) + 0.1)[:, None]

    def dataset_fn(ctx, batch_size, poison_after=None, on_element=None):
        ds = tf.data.Dataset.from_tensor_slices({"x": X, "y": Y})
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).repeat()
        if on_element is not None:
            ds = ds.enumerate().map(lambda i, e: on_element(i, e))
        return ds.batch(batch_size, drop_remainder=True)

    def model_fn():
        init = keras.initializers.Constant(0.05)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, kernel_initializer=init, name="hidden"),
                                 keras.layers.Dense(1, kernel_initializer=init, name="out")])

    def loss_fn(model, batch, training):
        err = tf.cast(model(batch["x"], training=training), tf.float32) - batch["y"]
        loss = tf.reduce_mean(tf.square(err))
        return loss, {"mae": tf.reduce_mean(tf.abs(err)), "weighted": (tf.reduce_mean(batch["x"][:, 0]), 2.0)}

    def make_trainer(model_dir, strategy="one_device", steps=12, batch=16, checkpoint_input_pipeline=True, **kw):
        settings = dict(iterations_per_loop=3, save_checkpoints_steps=6)
        settings.update(kw)
        return loop.Trainer(strategy_lib.get_strategy(strategy), TrainSettings(**settings), model_fn, loss_fn,
                            lambda v: opt.create_optimizer("adamw", v, 0.05, steps, 2), model_dir=model_dir,
                            train_steps=steps, global_batch_size=batch,
                            checkpoint_input_pipeline=checkpoint_input_pipeline)
    """
)
exec(TOY_SOURCE)  # noqa: S102 - defines dataset_fn, model_fn, loss_fn, make_trainer here too


def _ckpt_steps(model_dir):
    state = tf.train.get_checkpoint_state(model_dir)
    return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths] if state else []


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("full"))
    trainer = make_trainer(model_dir)  # noqa: F821
    result = trainer.train(dataset_fn)  # noqa: F821
    return model_dir, trainer, result


def test_trains_checkpoints_and_summarizes(full_run):
    model_dir, trainer, result = full_run
    losses = trainer.step_losses
    assert len(losses) == 12
    assert np.mean(losses[-3:]) < 0.3 * np.mean(losses[:3])
    assert _ckpt_steps(model_dir) == [6, 12]
    assert int(trainer.global_step.numpy()) == 12
    # Weighted metric: (mean x0, weight 2) averaged with its weights -> plain mean over the loop.
    assert set(result) == {"loss", "mae", "weighted"}
    events = os.listdir(os.path.join(model_dir, "train"))
    assert events and events[0].startswith("events.out.tfevents")
    tags, lr, texts = set(), {}, {}
    for e in tf.compat.v1.train.summary_iterator(os.path.join(model_dir, "train", events[0])):
        tags.update(v.tag for v in e.summary.value)
        for v in e.summary.value:
            if v.tag == "learning_rate":
                lr[e.step] = float(tf.make_ndarray(v.tensor))
            if v.metadata.plugin_data.plugin_name == "text":
                texts[v.tag] = (e.step, tf.make_ndarray(v.tensor).item().decode())
    assert {"loss", "mae", "learning_rate", "gradient_norm", "examples_per_second"} <= tags
    # What ran where, written once at the start (step 0): the environment report, the command, the model.
    assert set(texts) == {"run/environment", "run/command", "run/flags", "run/model_config"}
    assert {step for step, _ in texts.values()} == {0}
    environment = texts["run/environment"][1]
    assert f"TF {tf.__version__}" in environment and "oneDNN" in environment and "int8 serving:" in environment
    assert '"units": 8' in texts["run/model_config"][1]  # the toy model's hidden Dense layer
    # Logged with step s: the rate step s used (peak 0.05, 2 warmup steps, linear decay over 12 from step 0;
    # step s applies the update after s - 1 updates). Not the rate of the loop's first step.
    assert lr == pytest.approx({3: 0.05 * (1 - 2 / 12), 6: 0.05 * (1 - 5 / 12), 9: 0.05 * (1 - 8 / 12),
                                12: 0.05 * (1 - 11 / 12)})


def test_resume_continues_the_same_trajectory(full_run, tmp_path):
    _, full, _ = full_run
    first = make_trainer(str(tmp_path), steps=12)  # noqa: F821
    # Stop after 6 steps (a checkpoint), as if killed, then start again with the same command.
    first.train_steps = 6
    first.train(dataset_fn)  # noqa: F821
    second = make_trainer(str(tmp_path), steps=12)  # noqa: F821
    second.train(dataset_fn)  # noqa: F821
    assert int(second.global_step.numpy()) == 12
    # Weights, optimizer slots, step and input position were restored: the losses are the uninterrupted run's.
    np.testing.assert_allclose(first.step_losses + second.step_losses, full.step_losses, rtol=1e-6)


def test_gradient_accumulation_matches_the_full_batch(full_run, tmp_path):
    _, full, _ = full_run
    acc = make_trainer(str(tmp_path), gradient_accumulation_steps=2)  # noqa: F821
    acc.train(dataset_fn)  # noqa: F821
    # Mean-squared error is a mean over examples, so two halves summed give the same gradient.
    np.testing.assert_allclose(acc.step_losses, full.step_losses, rtol=1e-5)


def test_eval_weighted_metrics(full_run):
    _, trainer, _ = full_run
    results = trainer.evaluate(dataset_fn, 32, steps=2)  # noqa: F821
    assert results["global_step"] == 12
    np.testing.assert_allclose(results["weighted"], X[:64, 0].mean(), rtol=1e-5)  # noqa: F821


def test_non_finite_loss_stops_naming_the_step(tmp_path):
    def poison(i, e):
        # Example 100 is in batch 7 (16 per batch): step 7 gets a NaN loss.
        return dict(e, y=tf.where(i == 100, np.nan, e["y"]))

    trainer = make_trainer(str(tmp_path))  # noqa: F821
    with pytest.raises(TrainingError, match=r"loss is nan at step 7; stopped without saving "
                       r"\(last good checkpoint: .*ckpt-6\)"):
        trainer.train(lambda ctx, b: dataset_fn(ctx, b, on_element=poison))  # noqa: F821
    assert _ckpt_steps(str(tmp_path)) == [6]


def test_sigterm_saves_a_checkpoint(tmp_path):
    def send_sigterm(i, e):
        # While the second loop (steps 4-6) reads its data, this process gets SIGTERM.
        def kill(i):
            if int(i) == 16 * 4:
                os.kill(os.getpid(), 15)
            return i

        tf.py_function(kill, [i], tf.int64)
        return e

    # py_function makes the input unserializable, so the input position is not checkpointed here.
    trainer = make_trainer(str(tmp_path), save_checkpoints_steps=100, steps=30,  # noqa: F821
                           checkpoint_input_pipeline=False)
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(lambda ctx, b: dataset_fn(ctx, b, on_element=send_sigterm))  # noqa: F821
    # The input pipeline prefetches, so the signal lands while loop 1 or loop 2 runs: the trainer
    # finishes that loop (3 steps per host call) and saves there, never mid-loop, never later.
    assert info.value.step in (3, 6)
    assert _ckpt_steps(str(tmp_path)) == [info.value.step]


@pytest.mark.half_precision
def test_float16_loss_scaling_trains(tmp_path):
    trainer = make_trainer(str(tmp_path), mixed_precision="float16", steps=6)  # noqa: F821
    trainer.train(dataset_fn)  # noqa: F821
    assert np.all(np.isfinite(trainer.step_losses))
    assert trainer.step_losses[-1] < trainer.step_losses[0]
    names = [n for n, _ in tf.train.list_variables(str(tmp_path))]
    assert any(n.startswith("loss_scale/scale") for n in names)


class _Headed(tf.keras.Model):
    """The toy model with a task model's `head` attribute (what TrainSettings.head_learning_rate reaches)."""

    def __init__(self):
        super().__init__(name="headed")
        init = tf.keras.initializers.Constant(0.05)
        self.body = tf.keras.layers.Dense(8, kernel_initializer=init, name="hidden")
        self.head = tf.keras.layers.Dense(1, kernel_initializer=init, name="out")
        self.build((None, 4))

    def build(self, shape):
        self.body.build(shape)
        self.head.build((None, 8))

    def call(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("head_learning_rate", [None, 0.2])
def test_the_head_learns_at_its_own_rate(tmp_path, head_learning_rate):
    settings = TrainSettings(learning_rate=0.01, head_learning_rate=head_learning_rate, iterations_per_loop=3,
                                  save_checkpoints_steps=6)
    trainer = loop.Trainer(strategy_lib.get_strategy("one_device"), settings, _Headed, loss_fn,  # noqa: F821
                           optimizer_lib.optimizer_fn(settings, 6, 2), model_dir=str(tmp_path), train_steps=6, global_batch_size=16)
    paths = [v.path for v in trainer.model.trainable_variables]
    scales = dict(zip(paths, trainer.optimizer._lr_scales, strict=True))
    if head_learning_rate is None:
        assert set(scales.values()) == {1.0}
        assert "peak learning rate 0.01, weight decay 0.01" in trainer.run_summary()
    else:
        assert scales == pytest.approx({p: 20.0 if "/out/" in p else 1.0 for p in paths})
        assert sum(x == 20.0 for x in scales.values()) == 2  # the head's kernel and bias
        assert "peak learning rate 0.01 (the head's 0.2), weight decay 0.01" in trainer.run_summary()
    assert trainer.hparams()["head_learning_rate"] == pytest.approx(head_learning_rate or 0.01)
    trainer.train(dataset_fn)  # noqa: F821
    assert int(trainer.global_step) == 6


def test_strategy_errors_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="needs --tpu_name"):
        strategy_lib.get_strategy("tpu")
    with pytest.raises(ConfigError, match="unknown distribution_strategy 'gpu'"):
        strategy_lib.get_strategy("gpu")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="needs TF_CONFIG"):
        strategy_lib.get_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ConfigError, match="TF_CONFIG is not valid JSON"):
        strategy_lib.get_strategy("multi_worker")


def test_tpu_resolver_failure_is_one_line():
    # No TPU on this machine: the cluster resolver fails, and the message is one line naming the TPU.
    with pytest.raises(ConfigError) as info:
        strategy_lib.get_strategy("tpu", tpu="local")
    assert "\n" not in str(info.value) and str(info.value).startswith("cannot reach TPU 'local': ")


MIRRORED_SCRIPT = TOY_SOURCE + textwrap.dedent(
    """
    import json, sys
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    out = {}
    for name in ("one_device", "mirrored"):
        t = make_trainer(sys.argv[1] + "/" + name, strategy=name)
        t.train(dataset_fn)
        out[name] = {"replicas": t.strategy.num_replicas_in_sync, "losses": t.step_losses,
                     "kernel": t.model.get_layer("out").kernel.numpy().ravel().tolist()}
    t = make_trainer(sys.argv[1] + "/mirrored_fp16", strategy="mirrored", steps=3, mixed_precision="float16")
    t.train(dataset_fn)
    out["mirrored_fp16"] = {"losses": t.step_losses}
    print("RESULT" + json.dumps(out))
    """
)


@pytest.mark.half_precision
@pytest.mark.slow
def test_mirrored_two_cpus_matches_one_device(tmp_path):
    # A subprocess, so the two logical CPUs do not leak into the other tests.
    proc = subprocess.run([sys.executable, "-c", MIRRORED_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, timeout=240, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert out["mirrored"]["replicas"] == 2
    # Same global batch (each replica gets half of the one-device batch): float32 sums in a different order only.
    np.testing.assert_allclose(out["mirrored"]["losses"], out["one_device"]["losses"], rtol=1e-5)
    np.testing.assert_allclose(out["mirrored"]["kernel"], out["one_device"]["kernel"], rtol=1e-5, atol=1e-7)
    # float16 with loss scaling under 2 replicas (the loss-scale update runs once, cross-replica).
    assert len(out["mirrored_fp16"]["losses"]) == 3 and np.all(np.isfinite(out["mirrored_fp16"]["losses"]))
