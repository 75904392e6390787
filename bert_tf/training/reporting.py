"""What a training run tells its user: TensorBoard summaries, the run's description, the per-loop log
line and the profiler (docs/accelerators.md, "Monitoring in TensorBoard").

`Reporter` owns every summary writer of a Trainer (made lazily under model_dir/<kind>, no-ops on a
non-chief worker; no training code opens one) and writes the loop's scalars, the run's text
(environment, command, flags, model config) once, and the HParams session. `loop_report` turns one
host loop's outputs into its scalars and log line; `Profiler` captures the steps asked for. All of
it is best effort: a summary that cannot be written is a warning, never the end of a run.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Dict, Optional, Tuple

import tensorflow as tf

from bert_tf import env
from bert_tf.progress import format_eta
from bert_tf.training.errors import first_line

logger = logging.getLogger("bert_tf.training")


class Reporter:
    """The summary writers of one run: model_dir/<kind> (train, eval) and model_dir itself (HParams)."""

    def __init__(self, model_dir: str, is_chief: bool):
        self.model_dir = model_dir
        self.is_chief = is_chief
        self._writers = {}
        self._run_reported = False

    def writer(self, kind):
        if kind not in self._writers:
            if self.is_chief:
                self._writers[kind] = tf.summary.create_file_writer(os.path.join(self.model_dir, kind))
            else:
                self._writers[kind] = tf.summary.create_noop_writer()
        return self._writers[kind]

    def scalars(self, kind: str, step: int, values: Dict[str, float]) -> None:
        try:
            with self.writer(kind).as_default(step=step):
                for name, value in values.items():
                    tf.summary.scalar(name, value)
            self.writer(kind).flush()
        except (tf.errors.OpError, OSError) as e:
            # Summaries are best effort: on a full disk the run stops at the next checkpoint write
            # (TrainingError, earlier checkpoints intact), not with a traceback here.
            logger.warning("cannot write %s summaries at step %d (%s)", kind, step, first_line(e))

    def run_text(self, kind: str, model, step: int) -> None:
        """Once per Reporter, at the start of train() or evaluate(): the environment's one-line summary
        in the log, and the environment report, command line, flags and model config as TensorBoard
        text summaries (run/...) in model_dir/<kind>, so a run's board says what ran where."""
        if self._run_reported:
            return
        self._run_reported = True

        report = env.report()
        logger.info(env.summary_line(report))
        if not self.is_chief:
            return
        try:
            with self.writer(kind).as_default(step=step):
                for tag, text in env.run_text(model_config_json(model), report).items():
                    tf.summary.text(tag, text)
            self.writer(kind).flush()
        except (tf.errors.OpError, OSError) as e:
            logger.warning("cannot write the run's text summaries to %s (%s)", kind, first_line(e))

    def hparams(self, values: Dict, step: int) -> None:
        """Writes `values` to TensorBoard's HParams plugin, as a session whose run is model_dir itself
        (see Trainer.write_hparams). Chief only; best effort."""
        if not self.is_chief:
            return
        from tensorboard.plugins.hparams import api as hparams_api

        try:
            writer = tf.summary.create_file_writer(self.model_dir)
            with writer.as_default(step=step):
                hparams_api.hparams(values)
            writer.close()
        except (tf.errors.OpError, OSError) as e:
            logger.warning("cannot write the run's hyperparameters to %s (%s)", self.model_dir, first_line(e))


def loop_report(result: Dict[str, float], *, lr: float, grad_norm: float, health, steps: int, compiling: bool,
                elapsed: float, compile_seconds: float, global_batch_size: int, replicas: int,
                eta_seconds: Optional[float]) -> Tuple[Dict[str, float], str]:
    """(scalars, speed text of the log line) of one host loop of `steps` steps. A compiling loop's first
    step is not counted in examples/s (elapsed covers the others); its seconds go to speed/first_step_seconds.
    eta_seconds: None when there is no rate to tell it from yet."""
    timed = steps - 1 if compiling else steps  # the steps that examples/s and the ETA count
    summary = dict(result, learning_rate=lr, gradient_norm=grad_norm)
    speed = "examples/s and ETA from the next loop on"
    if timed:
        examples_per_sec = timed * global_batch_size / max(elapsed, 1e-9)
        summary.update(examples_per_second=examples_per_sec,
                       **health_scalars(health, timed, elapsed, examples_per_sec / replicas))
        speed = f"{examples_per_sec:.1f} examples/s ETA {format_eta(math.inf if eta_seconds is None else eta_seconds)}"
    if compiling:
        summary["speed/first_step_seconds"] = compile_seconds
        speed += f" (first step {compile_seconds:.1f} s: tracing and compiling, not counted)"
    return summary, speed


def health_scalars(health, steps: int, seconds: float, examples_per_second_per_replica: float) -> Dict[str, float]:
    """The speed and input scalars of one host loop (TensorBoard: speed/..., input/...), see
    inner_loop.make_train_loop for what the input wait measures."""
    wait = float(health["input_wait_seconds"])  # NaN: not measured (TrainSettings.input_wait_clock off)
    out = {"speed/seconds_per_step": seconds / steps,
           "speed/examples_per_second_per_replica": examples_per_second_per_replica}
    if not math.isnan(wait):
        out.update({"speed/input_wait_seconds_per_step": wait / steps,
                    "speed/compute_seconds_per_step": max(seconds - wait, 0.0) / steps,
                    "speed/input_wait_fraction": min(wait / max(seconds, 1e-9), 1.0)})
    positions = float(health["positions"])
    if positions:
        out["input/real_tokens_per_position"] = float(health["real_tokens"]) / positions
    return out


def model_config(model):
    """The model's BertConfig (the model's or its encoder's), or None."""
    for obj in (model, getattr(model, "encoder", None)):
        config = getattr(obj, "config", None)
        if hasattr(config, "to_json_string"):
            return config
    return None


def model_config_json(model) -> str:
    """The model's BertConfig as JSON (the model's or its encoder's), else its Keras config."""
    config = model_config(model)
    if config is not None:
        return config.to_json_string()
    try:
        return json.dumps(model.get_config(), indent=2, sort_keys=True, default=str)
    except (NotImplementedError, TypeError, ValueError):
        return f"{type(model).__name__} (no config)"


class Profiler:
    """Captures the TensorBoard profile of global steps first..last (TrainSettings.profile_steps) with
    tf.profiler.experimental.start/stop around the host loops that run them: train() ends a loop at
    step first - 1 and at step last, so the capture holds exactly those steps. The profile plugin
    lists it under the run `train` (logdir/plugins/profile/<time>/). The capture ends with the
    train() call: fine-tuning's evaluations split a range that spans one into one capture per part
    (the evaluation not in it). A profiler that cannot start (another one running) is one warning;
    training goes on."""

    def __init__(self, steps: Optional[Tuple[int, int]], logdir: str, is_chief: bool):
        self.steps = steps if is_chief else None
        self.logdir = logdir
        self.running = False
        self.done = False

    def steps_to_edge(self, step: int) -> int:
        """How many steps the next loop may run before it crosses the start or end of the capture."""
        if self.steps is None or self.done:
            return math.inf
        first, last = self.steps
        if step >= last:
            return math.inf
        return first - 1 - step if step < first - 1 else last - step

    def before_loop(self, step: int) -> None:
        if self.steps is None or self.running or self.done:
            return
        first, last = self.steps
        if first - 1 <= step < last:
            try:
                tf.profiler.experimental.start(self.logdir)
            except (tf.errors.OpError, ValueError, RuntimeError) as e:
                logger.warning("cannot start the profiler (%s); training without it", first_line(e))
                self.done = True
                return
            self.running = True
            logger.info("profiling steps %d-%d into %s", step + 1, last, self.logdir)

    def after_loop(self, step: int) -> None:
        if self.running and step >= self.steps[1]:
            self.stop()

    def stop(self) -> None:
        if not self.running:
            return
        self.running, self.done = False, True
        try:
            tf.profiler.experimental.stop()
        except (tf.errors.OpError, ValueError, RuntimeError) as e:
            logger.warning("cannot save the profile (%s)", first_line(e))
            return
        logger.info("profile saved under %s", os.path.join(self.logdir, "plugins", "profile"))
