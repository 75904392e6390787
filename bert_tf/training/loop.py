"""A reusable custom training loop on `tf.distribute` (pretraining and every fine-tuning runner).

The pieces a task brings:
  model_fn()                       -> keras.Model, built (variables exist) on return
  loss_fn(model, batch, training)  -> (loss float32 scalar, {name: value or (value, weight)})
  dataset_fn(input_context, batch_size) -> tf.data.Dataset of per-replica batches
                                      of `batch_size` examples, already sharded
                                      for `input_context` (see bert_tf.data.pipelines)

What the loop does with them (docs/design.md, "Decisions" and "The step apart from the loop"):
  * The step (training/step.py, the only code XLA compiles with `jit_compile`): per-replica
    grads / replicas, summed across replicas once, clipped by global norm, then the optimizer
    (`bert_tf.training.optimizer`) applies them. `gradient_accumulation_steps` micro-batches are
    summed before that one all-reduce, so the global batch is the same for any k. Mixed precision:
    Keras dtype policy `mixed_bfloat16` / `mixed_float16` (variables float32); float16 adds dynamic
    loss scaling.
  * The inner loop (training/inner_loop.py): `iterations_per_loop` steps per host call, one
    `tf.function` running a `tf.range` loop of `strategy.run(step)`; a process's first step runs
    alone (it traces and compiles); the evaluation batches.
  * Checkpoints (training/checkpointing.py, `tf.train.CheckpointManager`) every
    `save_checkpoints_steps` hold the model, optimizer slots, step and, where the strategy allows,
    the input pipeline position, so a resumed run continues exactly. SIGTERM saves one and exits;
    a non-finite loss stops without saving (training/errors.py: the one-line errors).
  * Reporting (training/reporting.py): TensorBoard summaries under model_dir/train and
    model_dir/eval; one log line per loop with step, loss, examples/s and ETA (a first step's
    tracing and compiling reported apart), on a terminal a live bar (bert_tf/progress.py); by
    default each loop's steps are chosen from the measured step time so that a line comes at least
    every ~30 s and at each tenth of the run (training/host_calls.py). Per loop also the speed (seconds per step, split into
    waiting for input and the rest), examples/s per replica and the batches' real tokens per
    position (input_mask / sequence_ids); the profiler.
`Trainer` here is the controller: it builds the model and optimizer, then works out each host
call's number of steps, runs it, checks it, logs it and saves when due.

A metric given as `(value, weight)` is averaged with those weights over all
batches (e.g. MLM accuracy weighted by the number of real predictions, as the
original's tf.metrics.accuracy); a bare value counts each batch equally.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from typing import Callable, Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from bert_tf import model_dir as model_dir_lib
from bert_tf import progress as progress_lib
from bert_tf.checkpoint_names import encoder_of
from bert_tf.errors import TrainingError, TrainingPreempted
from bert_tf.training import strategy as strategy_lib
from bert_tf.training import xla_cache, xla_gpu
from bert_tf.training.checkpointing import Checkpoints, input_signature
from bert_tf.training.errors import PEER_FAILURES, peer_detail
from bert_tf.training.host_calls import LIVE_SECONDS, CallSizer
from bert_tf.training.inner_loop import evaluate_batches, make_train_loop, mask_feature, run_host_loop
from bert_tf.training.reporting import Profiler, Reporter, loop_report, model_config
from bert_tf.training.settings import TrainSettings
from bert_tf.training.step import LossScale, TrainStep, dtype_policy

logger = logging.getLogger("bert_tf.training")

TRAIN_DIR, EVAL_DIR = model_dir_lib.TRAIN_DIR, model_dir_lib.EVAL_DIR


def count_parameters(model) -> int:
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


class Trainer:
    """Builds model + optimizer under a strategy, then trains / evaluates with checkpoints.

    Args:
      strategy: a `tf.distribute.Strategy` (bert_tf.training.strategy.get_strategy).
      settings: TrainSettings (how to train).
      model_fn: () -> built keras.Model (called under the strategy scope and dtype policy).
      loss_fn: (model, batch, training) -> (loss, metrics dict); see the module docstring.
      optimizer_fn: (trainable variables) -> a bert_tf.training.optimizer optimizer; with
        settings.head_learning_rate, (trainable variables, the model's head's variables).
      init_fn: optional (model) -> None, run only when model_dir has no checkpoint
        (e.g. load --init_checkpoint).
      model_dir: checkpoints, summaries; resumed from when it holds a checkpoint.
      train_steps: total optimizer steps (the run stops at this global step).
      global_batch_size: examples per optimizer step over all replicas and micro-batches.
      checkpoint_input_pipeline: save the input position with the checkpoints (one device only).
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        settings: TrainSettings,
        model_fn: Callable[[], keras.Model],
        loss_fn: Callable,
        optimizer_fn: Callable,
        init_fn: Optional[Callable[[keras.Model], None]] = None,
        *,
        model_dir: str,
        train_steps: int,
        global_batch_size: int,
        checkpoint_input_pipeline: bool = True,
    ):
        settings.validate(strategy.num_replicas_in_sync, train_steps=train_steps, global_batch_size=global_batch_size)
        if settings.seed is not None:  # Python, numpy and Keras (the model's initialisation, dropout)
            keras.utils.set_random_seed(settings.seed)
        self.strategy = strategy
        self.settings = settings
        self.model_dir = model_dir
        self.train_steps = train_steps
        # The whole run's steps (progress and its tenths): train_steps may be set lower between calls
        # to stop at an evaluation (runners/common.py).
        self.run_steps = train_steps
        self.global_batch_size = global_batch_size
        self.checkpoint_input_pipeline = checkpoint_input_pipeline
        self.loss_fn = loss_fn
        self.is_chief = strategy_lib.is_chief(strategy)
        with strategy.scope(), dtype_policy(settings.mixed_precision):
            self.model = model_fn()
            if settings.gradient_checkpointing:
                encoder_of(self.model).gradient_checkpointing = True
            head = getattr(self.model, "head", None)
            if settings.head_learning_rate is not None and head is not None:
                self.optimizer = optimizer_fn(self.model.trainable_variables, head.trainable_variables)
            else:
                self.optimizer = optimizer_fn(self.model.trainable_variables)
            self.loss_scale = LossScale() if settings.mixed_precision == "float16" else None
        self.global_step = self.optimizer.iterations
        items = dict(model=self.model, optimizer=self.optimizer)
        # Keras keeps dropout's random state in seed-generator variables that tf.train.Checkpoint
        # does not reach through the model; saving them makes a resumed run draw the same masks.
        seed_states = [v for v in self.model.non_trainable_variables if "seed_generator" in v.path]
        if seed_states:
            items["dropout_seeds"] = seed_states
        if self.loss_scale is not None:
            items["loss_scale"] = self.loss_scale
        self.checkpoints = Checkpoints(items, model_dir, strategy, is_chief=self.is_chief,
                                       keep_max=settings.keep_checkpoint_max,
                                       checkpoint_input_pipeline=checkpoint_input_pipeline
                                       and not settings.device_input)
        self._init_fn = init_fn
        self._live_input = None  # (dataset_fn, signature, iterator, step): the input kept between train() calls
        # The clock as this run has it: the setting, or by default on only where the step runs on the CPU.
        self.input_wait_clock = (settings.input_wait_clock if settings.input_wait_clock is not None
                                 else not strategy_lib.on_accelerator(strategy))
        self.step = TrainStep(strategy, self.model, self.optimizer, loss_fn, micro_batches=settings.num_micro_batches,
                              clip_norm=settings.clip_norm, jit_compile=settings.jit_compile, loss_scale=self.loss_scale,
                              whole_step=settings.compile_whole_step, steps_per_program=settings.steps_per_program)
        self._grad_fn, self._eval_fn = self.step.grad_fn, self.step.eval_fn  # (tests and benchmarks read them)
        self.reporter = Reporter(model_dir, self.is_chief)
        self.progress_stream = sys.stderr  # where the live bar goes on a terminal (tests: a fake one)
        self._sizer = CallSizer(settings.iterations_per_loop, train_steps,
                                same_on_all_workers=isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
                                multiple=settings.steps_per_program)
        self._train_loops = {}
        self._metric_names = None
        self._preempted = False
        # Every step's loss of this process's train() calls, in order, and one record per
        # loop {step, steps, seconds, loss, compile_seconds} (tests, benchmarks and tools read them).
        self.step_losses = []
        self.loop_history = []

    @property
    def train_step_traces(self) -> int:
        """How many times the gradient step was traced: compiled programs (one per batch shape) under XLA."""
        return self.step.grad_fn.experimental_get_tracing_count()

    def restore(self) -> Optional[str]:
        """Restores the newest complete checkpoint of model_dir (model, optimizer, step and the input
        signature it was trained on; the input position is train()'s business); on a fresh model_dir
        runs `init_fn`. Returns the restored path or None. Damaged checkpoints are skipped for older
        ones; TrainingError when none can be restored (Checkpoints.restore)."""
        path = self.checkpoints.restore(self.global_step)
        if path is None and self._init_fn is not None:
            self._init_fn(self.model)
        return path

    def hparams(self, extra: Optional[Dict] = None) -> Dict:
        """The run's hyperparameters for TensorBoard's HParams table: how it trains (TrainSettings),
        its global batch, steps and replicas, the model's size, and `extra` (the runner's: sequence
        length, packing, task...). Values are numbers, booleans or strings."""
        c = self.settings
        values = dict(learning_rate=c.learning_rate,
                      head_learning_rate=c.learning_rate if c.head_learning_rate is None else c.head_learning_rate,
                      optimizer=c.optimizer, weight_decay_rate=c.weight_decay_rate,
                      clip_norm=c.clip_norm, precision=c.mixed_precision, jit_compile=c.jit_compile,
                      gradient_checkpointing=c.gradient_checkpointing,
                      gradient_accumulation_steps=c.gradient_accumulation_steps, seed=-1 if c.seed is None else c.seed,
                      train_batch_size=self.global_batch_size, train_steps=self.train_steps,
                      replicas=self.strategy.num_replicas_in_sync, parameters=count_parameters(self.model))
        config = model_config(self.model)
        if config is not None:
            values.update(hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
                          num_attention_heads=config.num_attention_heads)
        values.update(extra or {})
        return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in values.items()}

    def write_hparams(self, extra: Optional[Dict] = None) -> None:
        """Writes self.hparams(extra) to TensorBoard's HParams plugin, as a session whose run is model_dir
        itself: its metrics are the last values of the scalars of model_dir/train and model_dir/eval
        (groups "train", "eval"), so the runs of a sweep, side by side under one --logdir, compare in one
        table. Chief only; best effort, as the other summaries."""
        if self.is_chief:
            self.reporter.hparams(self.hparams(extra), int(self.global_step.numpy()))

    # ------------------------------------------------------------------ public API
    def distribute(self, dataset_fn, batch_size_per_replica: int, micro_batches: int = 1, skip_batches: int = 0,
                   steps_per_element: int = 1):
        """The input for `strategy.run`: dataset_fn(ctx, batch) per replica, its first `skip_batches`
        batches dropped, grouped in `micro_batches` if > 1, those groups stacked by `steps_per_element`
        if > 1 (one element per K-step program: [K, micro_batches, ...]). Under OneDeviceStrategy it is a
        plain dataset, whose iterator can be checkpointed (tf.distribute's iterators cannot), unless
        settings.device_input asks for batches prefetched onto the device."""

        def per_replica(ctx):
            ds = dataset_fn(ctx, batch_size_per_replica)
            if skip_batches:
                ds = ds.skip(skip_batches)
            for group in (micro_batches, steps_per_element):
                if group > 1:
                    ds = ds.batch(group, drop_remainder=True)
            if micro_batches > 1 or steps_per_element > 1:
                ds = ds.prefetch(tf.data.AUTOTUNE)
            return ds

        if self._single_device() and not self.settings.device_input:
            return per_replica(tf.distribute.InputContext())
        options = tf.distribute.InputOptions(experimental_fetch_to_device=True)  # (the default, stated)
        return self.strategy.distribute_datasets_from_function(per_replica, options=options)

    def _single_device(self) -> bool:
        return isinstance(self.strategy, tf.distribute.OneDeviceStrategy)

    def run_summary(self, num_train_examples: Optional[int] = None, num_warmup_steps: Optional[int] = None,
                    extra: Optional[Dict] = None, unit: str = "examples") -> str:
        """Logs (and returns) what the run will do; `unit`: what a batch counts (packed "rows")."""
        c = self.settings
        gpu_flags = xla_gpu.in_effect()
        lines = [
            f"model: {type(self.model).__name__}, {count_parameters(self.model):,} trainable parameters",
            f"strategy: {strategy_lib.describe(self.strategy)}",
            f"global batch: {self.global_batch_size} ({c.gradient_accumulation_steps} micro-batch(es) of "
            f"{self.global_batch_size // (self.strategy.num_replicas_in_sync * c.gradient_accumulation_steps)} "
            f"per replica)",
            f"steps: {self.train_steps} (warmup {num_warmup_steps if num_warmup_steps is not None else 'n/a'}), "
            + (f"{c.iterations_per_loop} per loop" if c.iterations_per_loop else
               "per loop: from the step time (a log line at least every 30 s and at each tenth)")
            + f", checkpoint every {c.save_checkpoints_steps}",
            f"{unit}: {num_train_examples if num_train_examples is not None else 'unknown'} in the data, "
            f"{self.train_steps * self.global_batch_size:,} seen by the end",
            f"precision: {c.mixed_precision}, XLA: "
            + (f"on, {c.steps_per_program} whole steps as one program" if c.steps_per_program > 1 else
               "on, the whole step as one program" if c.compile_whole_step else "on" if c.jit_compile else "off")
            + f", clip_norm {c.clip_norm}, XLA cache: {xla_cache.current() or 'none'}"
            + f", gradient checkpointing: {'on' if c.gradient_checkpointing else 'off'}"
            + (f", XLA GPU flags: {gpu_flags}" if gpu_flags else ""),
            f"input-wait clock: {'on' if self.input_wait_clock else 'off'} ("
            + ("set" if c.input_wait_clock is not None else "the default on " + (
                "a GPU/TPU: the host enqueues the next step without waiting for this one"
                if strategy_lib.on_accelerator(self.strategy) else "the CPU")) + ")",
            f"optimizer: {c.optimizer}, peak learning rate {c.learning_rate:g}"
            + (f" (the head's {c.head_learning_rate:g})" if c.head_learning_rate is not None else "")
            + f", weight decay {c.weight_decay_rate:g}",
        ]
        for key, value in (extra or {}).items():
            lines.append(f"{key}: {value}")
        text = "\n  ".join(["run summary:"] + lines)
        logger.info(text)
        return text

    def train(self, dataset_fn, input_id: str = "", before_first_save: Optional[Callable[[], None]] = None
              ) -> Dict[str, float]:
        """Trains until `train_steps`, resuming from model_dir. Returns the last loop's metrics.

        input_id: names the data (e.g. its files) for the input signature, beside the batches' shapes;
          a checkpoint trained on another signature resumes weights, optimizer and step, not the position.
        before_first_save: called once before this call's first checkpoint (side files a model_dir
          needs), so a run that fails before it proves it trains writes nothing into model_dir.

        Raises TrainingError on a NaN/Inf loss (nothing saved) or TrainingPreempted (after saving).
        """
        c = self.settings
        replicas = self.strategy.num_replicas_in_sync
        per_replica = self.global_batch_size // (replicas * c.num_micro_batches)
        # The spec of one micro-batch (building the pipeline reads no data).
        spec = dataset_fn(tf.distribute.InputContext(), per_replica).element_spec
        if self._metric_names is None:
            self._metric_names = self.step.metric_names(spec)
        signature = input_signature(spec, per_replica, c.num_micro_batches, replicas, input_id)
        restored = self.restore()
        step = int(self.global_step.numpy())
        k = c.steps_per_program
        if step % k or self.train_steps % k:
            raise ValueError(f"steps_per_program {k} runs whole programs of {k} steps: the run's start (step {step}) "
                             f"and end (step {self.train_steps}) must be multiples of {k}")
        iterator, manager = self.checkpoints.resume_input(self.distribute, dataset_fn, per_replica, c.num_micro_batches,
                                                          signature, restored, step, self._live_input,
                                                          steps_per_element=k)
        self.reporter.run_text(TRAIN_DIR, self.model, step)
        mask_key = mask_feature(spec)
        if mask_key not in self._train_loops:
            self._train_loops[mask_key] = make_train_loop(self.strategy, self.step.replica_step, self._metric_names,
                                                          mask_key, clock_input=self.input_wait_clock,
                                                          steps_per_program=k)
        train_loop = self._train_loops[mask_key]

        last_saved = step
        result: Dict[str, float] = {}
        if step >= self.train_steps:
            logger.info("step %d >= num_train_steps %d: nothing to train", step, self.train_steps)
            return result
        previous_handler = self._install_sigterm()
        profiler = Profiler(c.profile_steps, os.path.join(self.model_dir, TRAIN_DIR), self.is_chief)
        total = self._sizer.total_steps = max(self.run_steps, self.train_steps)
        progress = progress_lib.Progress(total, start=step, stream=self.progress_stream, log=logger)
        self._sizer.target_seconds = LIVE_SECONDS if progress.live else progress_lib.PROGRESS_SECONDS
        try:
            start_time, start_step = time.time(), step
            while step < self.train_steps:
                next_save = (step // c.save_checkpoints_steps + 1) * c.save_checkpoints_steps
                n = min(self._sizer.steps(step), self.train_steps - step, next_save - step,
                        profiler.steps_to_edge(step))
                profiler.before_loop(step)
                # A function not yet traced in this process runs its first step alone: that call traces
                # and compiles (XLA: tens of seconds on a GPU), so speed and ETA count only the steps after it.
                compiling = train_loop.experimental_get_tracing_count() == 0
                losses, sums, grad_norm, health, elapsed, compile_seconds = run_host_loop(train_loop, iterator, n,
                                                                                          compiling, first_steps=k)
                if compiling:  # the clock starts where the first program ended (elapsed: the steps after it)
                    start_time, start_step = time.time() - elapsed, step + k
                self._sizer.observe(n, n - k if compiling else n, elapsed)
                bad = np.flatnonzero(~np.isfinite(losses))
                if bad.size:
                    raise TrainingError(
                        f"loss is {losses[bad[0]]} at step {step + bad[0] + 1}; stopped without saving "
                        f"(last good checkpoint: {manager.latest_checkpoint or 'none'})"
                    )
                step += n
                profiler.after_loop(step)
                lr = float(self.optimizer.last_learning_rate().numpy())  # that of step `step`, logged with it
                result = {name: float(s.numpy() / max(w.numpy(), 1e-12)) for name, (s, w) in sums.items()}
                result["loss"] = float(losses.mean())
                rate = (step - start_step) / max(time.time() - start_time, 1e-9)
                summary, speed = loop_report(
                    result, lr=lr, grad_norm=grad_norm, health=health, steps=n, compiling=compiling, elapsed=elapsed,
                    compile_seconds=compile_seconds, global_batch_size=self.global_batch_size, replicas=replicas,
                    eta_seconds=(total - step) / rate if rate > 0 else math.inf)
                self.reporter.scalars(TRAIN_DIR, step, summary)
                self.step_losses.extend(float(x) for x in losses)
                self.loop_history.append(dict(step=step, steps=n, seconds=elapsed, loss=result["loss"],
                                              compile_seconds=compile_seconds))
                metrics = " ".join(f"{k} {v:.4f}" for k, v in sorted(result.items()) if k != "loss")
                # The line of every loop in a log, on a terminal the bar and a line when one is due (and
                # before an evaluation or the end: this call's last step).
                progress.update(step, f"step {step}/{total} loss {result['loss']:.4f} {metrics} lr {lr:.3g} "
                                f"grad_norm {grad_norm:.3f} {speed}",
                                bar_text=f"step {step}/{total} loss {result['loss']:.4f} {speed}",
                                every_call=True, force=step == self.train_steps)
                self._live_input = (dataset_fn, signature, iterator, step)
                if step % c.save_checkpoints_steps == 0 or step == self.train_steps or self._preempted:
                    if before_first_save is not None:
                        before_first_save()
                        before_first_save = None
                if step % c.save_checkpoints_steps == 0 or step == self.train_steps:
                    self.checkpoints.save(manager, step)
                    last_saved = step
                if self._preempted:
                    path = self.checkpoints.save(manager, step) if last_saved != step else manager.latest_checkpoint
                    raise TrainingPreempted(step, path)
        except PEER_FAILURES as e:
            if not isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
                raise
            # A killed peer resets its connections (seen at once); one that vanishes is found by the
            # strategy's health check (a few tens of seconds) and the pending collective is aborted.
            raise TrainingError(
                f"a worker of the multi-worker cluster is gone at step {step} ({type(e).__name__}: "
                f"{peer_detail(e)}); restart every worker with the same command to resume "
                f"from {model_dir_lib.latest_checkpoint(self.model_dir) or 'the start'}"
            ) from None
        finally:
            progress.close()
            profiler.stop()
            self._restore_sigterm(previous_handler)
        return result

    def evaluate(self, dataset_fn, global_batch_size: int, steps: Optional[int] = None) -> Dict[str, float]:
        """Runs up to `steps` batches (all of the data when None) without training;
        returns the weighted metric averages and `global_step`, and writes eval/ summaries."""
        self.reporter.run_text(EVAL_DIR, self.model, int(self.global_step.numpy()))
        replicas = self.strategy.num_replicas_in_sync
        if global_batch_size % replicas:
            raise ValueError(f"eval_batch_size {global_batch_size} must be a multiple of replicas ({replicas})")
        dist = self.distribute(dataset_fn, global_batch_size // replicas)
        totals, count, first_seconds, rest_seconds = evaluate_batches(self.strategy, self.step.eval_fn, dist, steps)
        if totals is None:
            raise ValueError("evaluation data is empty")
        results = {k: v / max(w, 1e-12) for k, (v, w) in totals.items()}
        step = int(self.global_step.numpy())
        self.reporter.scalars(EVAL_DIR, step, results)
        results["global_step"] = step
        timing = f"first batch {first_seconds:.1f} s with tracing and compiling"
        if count > 1:
            timing = f"{(count - 1) * global_batch_size / max(rest_seconds, 1e-9):.1f} examples/s; " + timing
        logger.info("eval at step %d over %d batches (%s): %s", step, count, timing,
                    " ".join(f"{k} {v:.4f}" for k, v in sorted(results.items()) if k != "global_step"))
        return results

    # ------------------------------------------------------------------ SIGTERM
    def _install_sigterm(self):
        try:
            def handler(signum, frame):
                logger.warning("SIGTERM received: saving a checkpoint after the current loop")
                self._preempted = True

            return signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread
            return None

    def _restore_sigterm(self, previous):
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
