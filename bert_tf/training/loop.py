"""A reusable custom training loop on `tf.distribute` (pretraining and every fine-tuning runner).

The pieces a task brings:
  model_fn()                       -> keras.Model, built (variables exist) on return
  loss_fn(model, batch, training)  -> (loss float32 scalar, {name: value or (value, weight)})
  dataset_fn(input_context, batch_size) -> tf.data.Dataset of per-replica batches
                                      of `batch_size` examples, already sharded
                                      for `input_context` (see bert_tf.data.pipelines)

What the loop does with them (docs/design.md, "Decisions"):
  * `iterations_per_loop` steps per host call: one `tf.function` runs a `tf.range`
    loop of `strategy.run(step)`; the per-replica forward/backward can be
    XLA-compiled (`jit_compile`).
  * Gradients: per-replica grads / replicas, summed across replicas once,
    clipped by global norm, then the optimizer (`bert_tf.training.optimizer`)
    applies them. `gradient_accumulation_steps` micro-batches are summed before
    that one all-reduce, so the global batch is the same for any k.
  * Mixed precision: Keras dtype policy `mixed_bfloat16` / `mixed_float16`
    (variables float32); float16 adds dynamic loss scaling.
  * Checkpoints (`tf.train.CheckpointManager`) every `save_checkpoints_steps`
    hold the model, optimizer slots, step and, where the strategy allows, the
    input pipeline position, so a resumed run continues exactly. SIGTERM saves
    one and exits; a non-finite loss stops without saving.
  * TensorBoard summaries under model_dir/train and model_dir/eval; one log
    line per loop with step, loss, examples/s and ETA. Per loop also the speed
    (seconds per step, split into waiting for input and the rest), examples/s per
    replica and the batches' real tokens per position (input_mask / sequence_ids).

A metric given as `(value, weight)` is averaged with those weights over all
batches (e.g. MLM accuracy weighted by the number of real predictions, as the
original's tf.metrics.accuracy); a bare value counts each batch equally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import signal
import time
from typing import Callable, Dict, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from bert_tf import env
from bert_tf import model_dir as model_dir_lib
from bert_tf.training import optimizer as optimizer_lib
from bert_tf.training import strategy as strategy_lib
from bert_tf.training import xla_cache

logger = logging.getLogger("bert_tf.training")

PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
# Dynamic loss scaling for float16 (the usual values: start high, halve on
# overflow, double after this many finite steps).
INITIAL_LOSS_SCALE = 2.0**15
LOSS_SCALE_GROWTH_STEPS = 2000
TRAIN_DIR, EVAL_DIR = model_dir_lib.TRAIN_DIR, model_dir_lib.EVAL_DIR
# What a collective op raises when a peer is gone (connection reset, health check, timeout).
PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
                 tf.errors.AbortedError)


class TrainingError(RuntimeError):
    """Training cannot go on; the message is one line (scripts print it and exit non-zero)."""


class NonFiniteLossError(TrainingError):
    """Training produced a NaN/Inf loss; no checkpoint was written for it."""


class CheckpointWriteError(TrainingError):
    """A checkpoint could not be written (e.g. disk full); its partial files were removed."""


class WorkerLostError(TrainingError):
    """A peer of a multi-worker run died or became unreachable; restart every worker to resume."""


class CheckpointRestoreError(TrainingError):
    """model_dir holds checkpoints but none of them can be restored into this model."""


class TrainingPreempted(RuntimeError):
    """SIGTERM arrived; a checkpoint was saved at `step`."""

    def __init__(self, step: int, checkpoint: Optional[str]):
        super().__init__(f"SIGTERM: saved checkpoint {checkpoint} at step {step}")
        self.step = step
        self.checkpoint = checkpoint


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How to train, the same for pretraining and fine-tuning (not what to train, nor for how long).

    bert_flags.train_settings builds it from the flags every training script shares; the run says
    its own model_dir, number of steps, global batch size and warmup.
    jit_compile: XLA-compile the step. Build models that skip padding with skip_padding=False
      for it (bert_tf/models/encoder.py: the real-token count changes from batch to batch).
    seed: keras.utils.set_random_seed before the model is built (None: left as it is).
    """

    learning_rate: float = 5e-5
    optimizer: str = "adamw"
    weight_decay_rate: float = optimizer_lib.WEIGHT_DECAY_RATE
    clip_norm: float = optimizer_lib.CLIP_NORM
    mixed_precision: str = "float32"
    jit_compile: bool = False
    iterations_per_loop: int = 1000
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 5
    gradient_accumulation_steps: int = 1
    seed: Optional[int] = 12345
    # (first, last): capture a TensorBoard profile of these global steps (1-based, inclusive) into
    # model_dir/train/plugins/profile (the chief's). None: no profile.
    profile_steps: Optional[Tuple[int, int]] = None

    def validate(self, num_replicas: int, *, train_steps: int, global_batch_size: int) -> None:
        """One-line ValueErrors for settings a run of `train_steps` x `global_batch_size` cannot use."""
        if train_steps <= 0:
            raise ValueError(f"num_train_steps must be positive, got {train_steps}")
        if self.iterations_per_loop <= 0:
            raise ValueError(f"iterations_per_loop must be positive, got {self.iterations_per_loop}")
        if self.save_checkpoints_steps <= 0:
            raise ValueError(f"save_checkpoints_steps must be positive, got {self.save_checkpoints_steps}")
        if self.keep_checkpoint_max <= 0:
            raise ValueError(f"keep_checkpoint_max must be positive, got {self.keep_checkpoint_max}")
        if self.gradient_accumulation_steps <= 0:
            raise ValueError(f"gradient_accumulation_steps must be positive, got {self.gradient_accumulation_steps}")
        if self.profile_steps is not None:
            first, last = self.profile_steps
            if not 1 <= first <= last:
                raise ValueError(f"profile_steps must be N,M with 1 <= N <= M, got {first},{last}")
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"mixed_precision must be one of {', '.join(PRECISIONS)}, got {self.mixed_precision!r}")
        split = num_replicas * self.gradient_accumulation_steps
        if global_batch_size <= 0 or global_batch_size % split:
            raise ValueError(
                f"train_batch_size {global_batch_size} must be a positive multiple of replicas ({num_replicas}) "
                f"x gradient_accumulation_steps ({self.gradient_accumulation_steps})"
            )

    @property
    def num_micro_batches(self) -> int:
        return self.gradient_accumulation_steps

    def set_seed(self) -> None:
        """Seeds Python, numpy and Keras (initialisation, dropout) when `seed` is set."""
        if self.seed is not None:
            keras.utils.set_random_seed(self.seed)

    def optimizer_fn(self, train_steps: int, warmup_steps: int) -> Callable:
        """(trainable variables) -> the optimizer: warmup then linear decay to 0 at `train_steps`."""

        def make(variables):
            return optimizer_lib.create_optimizer(self.optimizer, variables, self.learning_rate, train_steps,
                                                  warmup_steps, weight_decay_rate=self.weight_decay_rate)

        return make


@contextlib.contextmanager
def dtype_policy(precision: str):
    """Keras' global dtype policy for building a model in `precision`, restored afterwards."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(PRECISIONS[precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def count_parameters(model) -> int:
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


class _LossScale(tf.Module):
    """Dynamic loss scale for float16: halve on overflow, double after LOSS_SCALE_GROWTH_STEPS good steps."""

    def __init__(self):
        super().__init__(name="loss_scale")
        agg = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.scale = tf.Variable(INITIAL_LOSS_SCALE, trainable=False, aggregation=agg, name="scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=agg, name="good_steps")

    def update(self, finite):
        """Cross-replica: `finite` is the same on every replica after the all-reduce."""
        grow = finite & (self.good_steps + 1 >= LOSS_SCALE_GROWTH_STEPS)
        self.scale.assign(tf.where(grow, self.scale * 2.0, tf.where(finite, self.scale, self.scale / 2.0)))
        self.good_steps.assign(tf.where(finite & ~grow, self.good_steps + 1, tf.zeros_like(self.good_steps)))


def _dummy_batch(spec):
    """Zeros shaped like one element of `spec` with batch size 1 (builds models, finds metric names)."""

    def zeros(s):
        shape = [1 if d is None else d for d in s.shape.as_list()]
        return tf.zeros(shape, s.dtype)

    return tf.nest.map_structure(zeros, spec)


def _metric_terms(metrics: Dict) -> Dict[str, tuple]:
    """{name: value or (value, weight)} -> {name: (value * weight, weight)} float32."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, (tuple, list)):
            v, w = (tf.cast(x, tf.float32) for x in value)
        else:
            v, w = tf.cast(value, tf.float32), tf.constant(1.0)
        out[name] = (v * w, w)
    return out


class Trainer:
    """Builds model + optimizer under a strategy, then trains / evaluates with checkpoints.

    Args:
      strategy: a `tf.distribute.Strategy` (bert_tf.training.strategy.get_strategy).
      settings: TrainSettings (how to train).
      model_fn: () -> built keras.Model (called under the strategy scope and dtype policy).
      loss_fn: (model, batch, training) -> (loss, metrics dict); see the module docstring.
      optimizer_fn: (trainable variables) -> a bert_tf.training.optimizer optimizer.
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
        self.strategy = strategy
        self.settings = settings
        self.model_dir = model_dir
        self.train_steps = train_steps
        self.global_batch_size = global_batch_size
        self.checkpoint_input_pipeline = checkpoint_input_pipeline
        self.loss_fn = loss_fn
        self.is_chief = strategy_lib.is_chief(strategy)
        with strategy.scope(), dtype_policy(settings.mixed_precision):
            self.model = model_fn()
            self.optimizer = optimizer_fn(self.model.trainable_variables)
            self.loss_scale = _LossScale() if settings.mixed_precision == "float16" else None
        self.global_step = self.optimizer.iterations
        self._checkpoint_items = dict(model=self.model, optimizer=self.optimizer)
        # Keras keeps dropout's random state in seed-generator variables that tf.train.Checkpoint
        # does not reach through the model; saving them makes a resumed run draw the same masks.
        seed_states = [v for v in self.model.non_trainable_variables if "seed_generator" in v.path]
        if seed_states:
            self._checkpoint_items["dropout_seeds"] = seed_states
        if self.loss_scale is not None:
            self._checkpoint_items["loss_scale"] = self.loss_scale
        self._init_fn = init_fn
        # What input the checkpoints' position belongs to (Trainer.input_signature): a resumed run with
        # other records (phase 2 of pretraining at another seq length, other files, batch size or
        # packing) starts its input from the beginning instead of restoring another pipeline's state.
        with tf.device("/cpu:0"):
            self._input_signature = tf.Variable("", dtype=tf.string, trainable=False, name="input_signature")
        self._live_input = None  # (dataset_fn, signature, iterator, step): the input kept between train() calls
        # No autograph inside a step: converting the model, loss and optimizer code costs
        # seconds of tracing and they have no tensor-dependent Python control flow
        # (a loss_fn that needs some uses tf.cond / keras.ops.cond).
        self._grad_fn = tf.function(self._compute_grads, jit_compile=settings.jit_compile, autograph=False)
        self._eval_fn = tf.function(self._eval_outputs, jit_compile=settings.jit_compile, autograph=False)
        self._train_loops = {}
        self._metric_names = None
        self._summary_writers = {}
        self._run_reported = False
        self._preempted = False
        # Every step's loss of this process's train() calls, in order, and one record per
        # loop {step, steps, seconds, loss} (tests, benchmarks and tools read them).
        self.step_losses = []
        self.loop_history = []

    @property
    def train_step_traces(self) -> int:
        """How many times the gradient step was traced: compiled programs (one per batch shape) under XLA."""
        return self._grad_fn.experimental_get_tracing_count()

    # ------------------------------------------------------------------ pieces run per replica
    def _compute_grads(self, batch):
        """One micro-batch: (loss, metric terms, grads of loss / (replicas * micro-batches))."""
        with tf.GradientTape() as tape:
            loss, metrics = self.loss_fn(self.model, batch, training=True)
            loss = tf.cast(loss, tf.float32)
            scaled = loss / float(self.strategy.num_replicas_in_sync * self.settings.num_micro_batches)
            if self.loss_scale is not None:
                scaled = scaled * self.loss_scale.scale
        grads = tape.gradient(scaled, self.model.trainable_variables)
        grads = [tf.zeros(v.shape, tf.float32) if g is None else tf.cast(tf.convert_to_tensor(g), tf.float32)
                 for g, v in zip(grads, self.model.trainable_variables, strict=True)]
        if self.loss_scale is not None:
            grads = [g / self.loss_scale.scale for g in grads]
        return loss, _metric_terms(metrics), grads

    @tf.autograph.experimental.do_not_convert
    def _replica_step(self, batch):
        k = self.settings.num_micro_batches
        if k == 1:
            loss, terms, grads = self._grad_fn(batch)
        else:
            # batch: every tensor [k, micro_batch, ...]; grads and metrics are summed over the k slices.
            loss, terms, grads = self._grad_fn(tf.nest.map_structure(lambda t: t[0], batch))
            for j in range(1, k):  # k calls of one traced function: the graph grows by k call ops only
                l_j, t_j, g_j = self._grad_fn(tf.nest.map_structure(lambda t, j=j: t[j], batch))
                loss += l_j
                terms = tf.nest.map_structure(tf.add, terms, t_j)
                grads = [a + b for a, b in zip(grads, g_j, strict=True)]
            loss /= float(k)
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        clip_scale, grad_norm = optimizer_lib.global_norm_clip_scale(grads, self.settings.clip_norm)
        finite = None
        if self.loss_scale is not None:
            finite = tf.math.is_finite(grad_norm)
            # Every replica holds the same all-reduced `finite`; the update runs once, cross-replica.
            ctx.merge_call(lambda strategy, f: self.loss_scale.update(strategy.experimental_local_results(f)[0]),
                           args=(finite,))
        self.optimizer.apply_gradients(grads, apply=finite, grad_scale=clip_scale)
        return loss, terms, grad_norm

    def _eval_outputs(self, batch):
        loss, metrics = self.loss_fn(self.model, batch, training=False)
        metrics = dict(metrics)
        metrics.setdefault("loss", loss)
        return _metric_terms(metrics)

    # ------------------------------------------------------------------ host-side loop functions
    def _make_train_loop(self, mask_key: Optional[str]):
        """The host call of `num_steps` steps: (losses, metric sums, mean gradient norm, health), where
        health = {input_wait_seconds: time the loop was blocked in the input iterator's get_next,
        summed over the steps; real_tokens, positions: nonzero entries of the batches' `mask_key`
        feature (input_mask, or packed rows' sequence_ids) and all its entries}.

        The wait is measured in the graph with tf.timestamp: each step's clock starts once the
        previous step's outputs exist, and stops when the next batch is there. It is host time: on a
        GPU/TPU, whose kernels run asynchronously, a step's device work may still run while the next
        get_next waits, so there the wait is that of the host (as in tf.data's own accounting)."""
        strategy = self.strategy
        names = self._metric_names

        def count_tokens(batch):
            mask = tf.cast(tf.not_equal(batch[mask_key], 0), tf.float32)
            return tf.reduce_sum(mask), tf.cast(tf.size(mask), tf.float32)

        @tf.function
        def train_loop(iterator, num_steps):
            losses = tf.TensorArray(tf.float32, size=num_steps)
            sums = {n: (tf.constant(0.0), tf.constant(0.0)) for n in names}
            norm_sum = tf.constant(0.0)
            wait, real, positions = tf.constant(0.0, tf.float64), tf.constant(0.0), tf.constant(0.0)
            done = tf.constant(0.0)  # a value of the previous step: the next step's clock starts after it
            for i in tf.range(num_steps):
                with tf.control_dependencies([done]):
                    asked = tf.timestamp()
                with tf.control_dependencies([asked]):
                    batch = next(iterator)
                with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                    wait += tf.timestamp() - asked
                loss, terms, norm = strategy.run(self._replica_step, args=(batch,))
                loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)
                # One reduce per tensor: MultiWorkerMirroredStrategy's reduce rejects a nested structure.
                terms = tf.nest.map_structure(
                    lambda t: strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None), terms)
                sums = tf.nest.map_structure(tf.add, sums, terms)
                norm = strategy.reduce(tf.distribute.ReduceOp.MEAN, norm, axis=None)
                norm_sum += norm
                losses = losses.write(i, loss)
                if mask_key is not None:
                    r, p = strategy.run(count_tokens, args=(batch,))
                    real += strategy.reduce(tf.distribute.ReduceOp.SUM, r, axis=None)
                    positions += strategy.reduce(tf.distribute.ReduceOp.SUM, p, axis=None)
                done = loss + norm
            health = dict(input_wait_seconds=wait, real_tokens=real, positions=positions)
            return losses.stack(), sums, norm_sum / tf.cast(num_steps, tf.float32), health

        return train_loop

    # ------------------------------------------------------------------ checkpoints
    def _manager(self, iterator=None):
        items = dict(self._checkpoint_items, input_signature=self._input_signature)
        if iterator is not None:
            items["train_iterator"] = iterator
        checkpoint = tf.train.Checkpoint(**items)
        directory = self.model_dir
        if not self.is_chief:
            # Every worker must take part in the save; only the chief's copy is kept.
            task = self.strategy.cluster_resolver.task_id
            directory = os.path.join(directory, f".worker_{task}_tmp")
        return tf.train.CheckpointManager(checkpoint, directory, max_to_keep=self.settings.keep_checkpoint_max)

    def restore(self) -> Optional[str]:
        """Restores the newest complete checkpoint of model_dir (model, optimizer, step and the input
        signature it was trained on; the input position is train()'s business); on a fresh model_dir
        runs `init_fn`. Returns the restored path or None.

        A checkpoint that cannot be read (cut short by a kill or a full disk, a file missing, the
        state file naming a checkpoint that is gone) is skipped with a warning and the next older
        one is tried, so a run never resumes from a damaged checkpoint nor silently starts over.
        Raises CheckpointRestoreError when checkpoints exist but none can be restored, saying whether
        their files are missing, unreadable, or belong to another model (the first variable that
        differs, with both shapes)."""
        checkpoint = tf.train.Checkpoint(**self._checkpoint_items)
        self._input_signature.assign("")
        if self.is_chief:
            leftovers = model_dir_lib.remove_partial_saves(self.model_dir)
            if leftovers:
                logger.info("removed %d partial checkpoint save(s) of a killed run: %s", len(leftovers),
                            ", ".join(os.path.basename(p) for p in leftovers))
        problems = []
        for path in model_dir_lib.checkpoint_candidates(self.model_dir):
            try:
                status = checkpoint.restore(path)
                status.assert_existing_objects_matched().expect_partial()  # (input position: _resume_input)
                # Written since the input signature exists; an older checkpoint leaves it "" (unknown).
                tf.train.Checkpoint(input_signature=self._input_signature).read(path).expect_partial()
            except (tf.errors.OpError, ValueError, IndexError, AssertionError) as e:
                kind, detail = model_dir_lib.describe_restore_error(e)
                problems.append((kind, f"{os.path.basename(path)}: {kind}: {detail}"))
                logger.warning("cannot restore %s (%s: %s); trying an older checkpoint", path, kind, detail)
                continue
            logger.info("resumed from %s at step %d", path, int(self.global_step.numpy()))
            return path
        if problems:
            if {kind for kind, _ in problems} == {model_dir_lib.RESTORE_MISMATCH}:
                what, advice = " into this model", "; use another output_dir for a different model"
            else:
                what, advice = "", "; check that its files are complete and readable, or move the damaged ones away"
            raise CheckpointRestoreError(
                f"{self.model_dir}: none of its {len(problems)} checkpoint(s) can be restored{what} "
                f"({problems[0][1]}){advice}"
            )
        if self._init_fn is not None:
            self._init_fn(self.model)
        return None

    def _save(self, manager) -> Optional[str]:
        step = int(self.global_step.numpy())
        try:
            path = manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as e:
            # Disk full, quota, permissions: remove what was written of this step's checkpoint so nothing
            # half-written sits beside the complete checkpoints (the state file still names those).
            prefix = model_dir_lib.checkpoint_prefix(manager.directory, step)
            for leftover in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(prefix + "_temp*"):
                with contextlib.suppress(tf.errors.OpError, OSError):
                    if tf.io.gfile.isdir(leftover):
                        tf.io.gfile.rmtree(leftover)
                    else:
                        tf.io.gfile.remove(leftover)
            raise CheckpointWriteError(
                f"{manager.directory}: cannot write checkpoint {os.path.basename(prefix)} ({_first_line(e)}); "
                f"earlier checkpoints are intact (latest: {manager.latest_checkpoint or 'none'})"
            ) from None
        if not self.is_chief:
            tf.io.gfile.rmtree(manager.directory)
            return None
        logger.info("saved checkpoint %s", path)
        return path

    # ------------------------------------------------------------------ summaries
    def _writer(self, kind):
        if kind not in self._summary_writers:
            if self.is_chief:
                self._summary_writers[kind] = tf.summary.create_file_writer(os.path.join(self.model_dir, kind))
            else:
                self._summary_writers[kind] = tf.summary.create_noop_writer()
        return self._summary_writers[kind]

    def _write_summaries(self, kind, step, values):
        try:
            with self._writer(kind).as_default(step=step):
                for name, value in values.items():
                    tf.summary.scalar(name, value)
            self._writer(kind).flush()
        except (tf.errors.OpError, OSError) as e:
            # Summaries are best effort: on a full disk the run stops at the next checkpoint write
            # (CheckpointWriteError, earlier checkpoints intact), not with a traceback here.
            logger.warning("cannot write %s summaries at step %d (%s)", kind, step, _first_line(e))

    def _report_run(self, kind):
        """Once per Trainer, at the start of train() or evaluate(): the environment's one-line summary
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
            with self._writer(kind).as_default(step=int(self.global_step.numpy())):
                for tag, text in env.run_text(_model_config_json(self.model), report).items():
                    tf.summary.text(tag, text)
            self._writer(kind).flush()
        except (tf.errors.OpError, OSError) as e:
            logger.warning("cannot write the run's text summaries to %s (%s)", kind, _first_line(e))

    def hparams(self, extra: Optional[Dict] = None) -> Dict:
        """The run's hyperparameters for TensorBoard's HParams table: how it trains (TrainSettings),
        its global batch, steps and replicas, the model's size, and `extra` (the runner's: sequence
        length, packing, task...). Values are numbers, booleans or strings."""
        c = self.settings
        values = dict(learning_rate=c.learning_rate, optimizer=c.optimizer, weight_decay_rate=c.weight_decay_rate,
                      clip_norm=c.clip_norm, precision=c.mixed_precision, jit_compile=c.jit_compile,
                      gradient_accumulation_steps=c.gradient_accumulation_steps, seed=-1 if c.seed is None else c.seed,
                      train_batch_size=self.global_batch_size, train_steps=self.train_steps,
                      replicas=self.strategy.num_replicas_in_sync, parameters=count_parameters(self.model))
        config = _model_config(self.model)
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
        if not self.is_chief:
            return
        from tensorboard.plugins.hparams import api as hparams_api

        values = self.hparams(extra)
        try:
            writer = tf.summary.create_file_writer(self.model_dir)
            with writer.as_default(step=int(self.global_step.numpy())):
                hparams_api.hparams(values)
            writer.close()
        except (tf.errors.OpError, OSError) as e:
            logger.warning("cannot write the run's hyperparameters to %s (%s)", self.model_dir, _first_line(e))

    # ------------------------------------------------------------------ public API
    def distribute(self, dataset_fn, batch_size_per_replica: int, micro_batches: int = 1, skip_batches: int = 0):
        """The input for `strategy.run`: dataset_fn(ctx, batch) per replica, its first `skip_batches`
        batches dropped, grouped in `micro_batches` if > 1. Under OneDeviceStrategy it is a plain
        dataset, whose iterator can be checkpointed (tf.distribute's iterators cannot)."""

        def per_replica(ctx):
            ds = dataset_fn(ctx, batch_size_per_replica)
            if skip_batches:
                ds = ds.skip(skip_batches)
            if micro_batches > 1:
                ds = ds.batch(micro_batches, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
            return ds

        if self._single_device():
            return per_replica(tf.distribute.InputContext())
        return self.strategy.distribute_datasets_from_function(per_replica)

    def _single_device(self) -> bool:
        return isinstance(self.strategy, tf.distribute.OneDeviceStrategy)

    def _discover_metrics(self, element_spec):
        if self._metric_names is None:
            with self.strategy.scope():
                _, metrics = self.loss_fn(self.model, _dummy_batch(element_spec), training=False)
            self._metric_names = sorted(metrics)

    def run_summary(self, num_train_examples: Optional[int] = None, num_warmup_steps: Optional[int] = None,
                    extra: Optional[Dict] = None, unit: str = "examples") -> str:
        """Logs (and returns) what the run will do; `unit`: what a batch counts (packed "rows")."""
        c = self.settings
        lines = [
            f"model: {type(self.model).__name__}, {count_parameters(self.model):,} trainable parameters",
            f"strategy: {strategy_lib.describe(self.strategy)}",
            f"global batch: {self.global_batch_size} ({c.gradient_accumulation_steps} micro-batch(es) of "
            f"{self.global_batch_size // (self.strategy.num_replicas_in_sync * c.gradient_accumulation_steps)} "
            f"per replica)",
            f"steps: {self.train_steps} (warmup {num_warmup_steps if num_warmup_steps is not None else 'n/a'}), "
            f"{c.iterations_per_loop} per loop, checkpoint every {c.save_checkpoints_steps}",
            f"{unit}: {num_train_examples if num_train_examples is not None else 'unknown'} in the data, "
            f"{self.train_steps * self.global_batch_size:,} seen by the end",
            f"precision: {c.mixed_precision}, XLA: {'on' if c.jit_compile else 'off'}, clip_norm {c.clip_norm}"
            + (f", XLA cache: {xla_cache.current()}" if xla_cache.current() else ""),
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

        Raises NonFiniteLossError (nothing saved) or TrainingPreempted (after saving).
        """
        c = self.settings
        replicas = self.strategy.num_replicas_in_sync
        per_replica = self.global_batch_size // (replicas * c.num_micro_batches)
        # The spec of one micro-batch (building the pipeline reads no data).
        spec = dataset_fn(tf.distribute.InputContext(), per_replica).element_spec
        self._discover_metrics(spec)
        signature = input_signature(spec, per_replica, c.num_micro_batches, replicas, input_id)
        restored = self.restore()
        iterator, manager = self._resume_input(dataset_fn, per_replica, signature, restored)
        self._report_run(TRAIN_DIR)
        mask_key = _mask_feature(spec)
        if mask_key not in self._train_loops:
            self._train_loops[mask_key] = self._make_train_loop(mask_key)
        train_loop = self._train_loops[mask_key]

        step = int(self.global_step.numpy())
        last_saved = step
        result: Dict[str, float] = {}
        if step >= self.train_steps:
            logger.info("step %d >= num_train_steps %d: nothing to train", step, self.train_steps)
            return result
        previous_handler = self._install_sigterm()
        profiler = _Profiler(c.profile_steps, os.path.join(self.model_dir, TRAIN_DIR), self.is_chief)
        try:
            start_time, start_step = time.time(), step
            while step < self.train_steps:
                next_save = (step // c.save_checkpoints_steps + 1) * c.save_checkpoints_steps
                n = min(c.iterations_per_loop, self.train_steps - step, next_save - step, profiler.steps_to_edge(step))
                profiler.before_loop(step)
                # A function not yet traced in this process runs its first step alone: that call traces
                # and compiles (XLA: tens of seconds on a GPU), so speed and ETA count only the steps after it.
                compiling = train_loop.experimental_get_tracing_count() == 0
                losses, sums, grad_norm, health, elapsed, compile_seconds = _run_host_loop(train_loop, iterator, n,
                                                                                           compiling)
                if compiling:
                    start_time, start_step = time.time(), step + 1
                bad = np.flatnonzero(~np.isfinite(losses))
                if bad.size:
                    raise NonFiniteLossError(
                        f"loss is {losses[bad[0]]} at step {step + bad[0] + 1}; stopped without saving "
                        f"(last good checkpoint: {manager.latest_checkpoint or 'none'})"
                    )
                step += n
                profiler.after_loop(step)
                lr = float(self.optimizer.last_learning_rate().numpy())  # that of step `step`, logged with it
                result = {name: float(s.numpy() / max(w.numpy(), 1e-12)) for name, (s, w) in sums.items()}
                result["loss"] = float(losses.mean())
                timed = n - 1 if compiling else n  # the steps that examples/s and the ETA count
                summary = dict(result, learning_rate=lr, gradient_norm=grad_norm)
                speed = "examples/s and ETA from the next loop on"
                if timed:
                    examples_per_sec = timed * self.global_batch_size / max(elapsed, 1e-9)
                    summary.update(examples_per_second=examples_per_sec,
                                   **_health_scalars(health, timed, elapsed, examples_per_sec / replicas))
                    rate = (step - start_step) / max(time.time() - start_time, 1e-9)
                    eta = (self.train_steps - step) / rate if rate > 0 else math.inf
                    speed = f"{examples_per_sec:.1f} examples/s ETA {_format_eta(eta)}"
                if compiling:
                    summary["speed/first_step_seconds"] = compile_seconds
                    speed += f" (first step {compile_seconds:.1f} s: tracing and compiling, not counted)"
                self._write_summaries(TRAIN_DIR, step, summary)
                self.step_losses.extend(float(x) for x in losses)
                self.loop_history.append(dict(step=step, steps=n, seconds=elapsed, loss=result["loss"],
                                              compile_seconds=compile_seconds))
                logger.info(
                    "step %d/%d loss %.4f %s lr %.3g grad_norm %.3f %s",
                    step, self.train_steps, result["loss"],
                    " ".join(f"{k} {v:.4f}" for k, v in sorted(result.items()) if k != "loss"),
                    lr, grad_norm, speed,
                )
                self._live_input = (dataset_fn, signature, iterator, step)
                if step % c.save_checkpoints_steps == 0 or step == self.train_steps or self._preempted:
                    if before_first_save is not None:
                        before_first_save()
                        before_first_save = None
                if step % c.save_checkpoints_steps == 0 or step == self.train_steps:
                    self._save(manager)
                    last_saved = step
                if self._preempted:
                    path = self._save(manager) if last_saved != step else manager.latest_checkpoint
                    raise TrainingPreempted(step, path)
        except PEER_FAILURES as e:
            if not isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
                raise
            # A killed peer resets its connections (seen at once); one that vanishes is found by the
            # strategy's health check (a few tens of seconds) and the pending collective is aborted.
            raise WorkerLostError(
                f"a worker of the multi-worker cluster is gone at step {step} ({type(e).__name__}: "
                f"{_peer_detail(e)}); restart every worker with the same command to resume "
                f"from {model_dir_lib.latest_checkpoint(self.model_dir) or 'the start'}"
            ) from None
        finally:
            profiler.stop()
            self._restore_sigterm(previous_handler)
        return result

    def evaluate(self, dataset_fn, global_batch_size: int, steps: Optional[int] = None) -> Dict[str, float]:
        """Runs up to `steps` batches (all of the data when None) without training;
        returns the weighted metric averages and `global_step`, and writes eval/ summaries."""
        self._report_run(EVAL_DIR)
        replicas = self.strategy.num_replicas_in_sync
        if global_batch_size % replicas:
            raise ValueError(f"eval_batch_size {global_batch_size} must be a multiple of replicas ({replicas})")
        dist = self.distribute(dataset_fn, global_batch_size // replicas)
        strategy = self.strategy

        @tf.function
        def eval_step(batch):
            terms = strategy.run(self._eval_fn, args=(batch,))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, terms, axis=None)

        totals = None
        count = 0
        iterator = iter(dist)
        start = time.time()
        first_seconds = 0.0
        while steps is None or count < steps:
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            terms = eval_step(batch.get_value())
            terms = {k: (float(v.numpy()), float(w.numpy())) for k, (v, w) in terms.items()}
            totals = terms if totals is None else {k: (totals[k][0] + v, totals[k][1] + w)
                                                   for k, (v, w) in terms.items()}
            count += 1
            if count == 1:  # the first batch traces and compiles the eval step
                first_seconds, start = time.time() - start, time.time()
        if totals is None:
            raise ValueError("evaluation data is empty")
        results = {k: v / max(w, 1e-12) for k, (v, w) in totals.items()}
        step = int(self.global_step.numpy())
        self._write_summaries(EVAL_DIR, step, results)
        results["global_step"] = step
        timing = f"first batch {first_seconds:.1f} s with tracing and compiling"
        if count > 1:
            timing = f"{(count - 1) * global_batch_size / max(time.time() - start, 1e-9):.1f} examples/s; " + timing
        logger.info("eval at step %d over %d batches (%s): %s", step, count, timing,
                    " ".join(f"{k} {v:.4f}" for k, v in sorted(results.items()) if k != "global_step"))
        return results

    # ------------------------------------------------------------------ input position
    def _resume_input(self, dataset_fn, per_replica: int, signature: str, restored: Optional[str]):
        """(iterator, checkpoint manager) for train(), positioned where the restored checkpoint's input
        stopped (docs/reliability.md, rule 3):
        - the same input in the same process: the iterator the last train() call left;
        - the same input after a restart: one device restores the saved tf.data position; strategies
          whose iterators cannot be saved (Mirrored, MultiWorker, TPU) skip the batches the restored
          step consumed, so with a seed the batches follow on exactly and no example comes twice early;
        - another input (two-phase pretraining: seq 128 then 512): weights, optimizer and step resume,
          the new input starts at its beginning; one log line says which of these happened."""
        c = self.settings
        step = int(self.global_step.numpy())
        old_signature = self._input_signature.numpy().decode("utf-8")
        self._input_signature.assign(signature)
        checkpointable = self._can_checkpoint_iterator()
        live = self._live_input
        if live is not None and live[0] is dataset_fn and live[1] == signature and live[3] == step:
            return live[2], self._manager(live[2] if checkpointable else None)
        same_input = restored is not None and old_signature == signature
        skip = 0
        if same_input and not checkpointable:
            skip = step * c.num_micro_batches * max(1, self.strategy.num_replicas_in_sync //
                                                   max(1, self._num_input_pipelines()))
        iterator = iter(self.distribute(dataset_fn, per_replica, c.num_micro_batches, skip_batches=skip))
        manager = self._manager(iterator if checkpointable else None)
        if restored is None:
            return iterator, manager
        if not same_input:
            logger.info("the input differs from the one %s was trained on (%s); weights, optimizer and step %d "
                        "resume, the input starts from its beginning", os.path.basename(restored),
                        _signature_change(old_signature, signature), step)
        elif checkpointable:
            try:
                status = tf.train.Checkpoint(train_iterator=iterator).read(restored)
                status.assert_existing_objects_matched()
                logger.info("input position restored from %s", os.path.basename(restored))
            except (AssertionError, ValueError, tf.errors.OpError) as e:
                # Saved under a strategy that cannot save its iterator, or by a pipeline of another
                # definition: move this one past what the step consumed. (Advanced in place, not with
                # Dataset.skip, so the definition, and so the next save's position, stays restorable.)
                logger.info("input position of %s not restored (%s)", os.path.basename(restored), _first_line(e)[:160])
                iterator = iter(self.distribute(dataset_fn, per_replica, c.num_micro_batches))
                manager = self._manager(iterator)
                skip = step * c.num_micro_batches
        if skip:
            logger.info("input position: skipping the %d batch(es) per input pipeline consumed by step %d "
                        "(reads them once, trains on none)", skip, step)
            if checkpointable:
                _advance(iterator, skip)
        return iterator, manager

    def _num_input_pipelines(self) -> int:
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy) and resolver is not None:
            return max(1, len(resolver.cluster_spec().as_dict().get("worker", [])))
        return 1

    # ------------------------------------------------------------------ SIGTERM
    def _can_checkpoint_iterator(self) -> bool:
        return self.checkpoint_input_pipeline and self._single_device()

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


class _Profiler:
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
                logger.warning("cannot start the profiler (%s); training without it", _first_line(e))
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
            logger.warning("cannot save the profile (%s)", _first_line(e))
            return
        logger.info("profile saved under %s", os.path.join(self.logdir, "plugins", "profile"))


def _run_host_loop(train_loop, iterator, n: int, compiling: bool):
    """Runs `n` steps through Trainer._make_train_loop's function -> (losses [n] numpy, metric sums,
    mean gradient norm, health floats, seconds of the timed steps, seconds of the first step or 0).

    compiling: the first step runs as a call of its own (tracing and compiling happen in it) and the
    rest as a second call; their outputs are merged, so the loop's results are those of one call of n
    steps, while `seconds` and the input wait in `health` cover only the n - 1 steps after the first."""

    def call(steps):
        start = time.time()
        losses, sums, norm, health = train_loop(iterator, tf.constant(steps, tf.int32))
        losses = losses.numpy()  # (waits for the call to finish)
        return losses, sums, float(norm.numpy()) * steps, {k: float(v.numpy()) for k, v in health.items()}, \
            time.time() - start

    if not compiling:
        losses, sums, norm_sum, health, seconds = call(n)
        return losses, sums, norm_sum / n, health, seconds, 0.0
    losses, sums, norm_sum, health, first_seconds = call(1)
    health["input_wait_seconds"], seconds = 0.0, 0.0
    if n > 1:
        more_losses, more_sums, more_norm, more_health, seconds = call(n - 1)
        losses = np.concatenate([losses, more_losses])
        sums = tf.nest.map_structure(tf.add, sums, more_sums)
        norm_sum += more_norm
        health = {k: health[k] + v for k, v in more_health.items()}
    return losses, sums, norm_sum / n, health, seconds, first_seconds


@tf.function(autograph=False)
def _advance_loop(iterator, n):
    def body(i):
        next(iterator)
        return i + 1

    return tf.while_loop(lambda i: i < n, body, [tf.constant(0, tf.int64)])


def _advance(iterator, n: int) -> None:
    """Draws and drops n elements of a tf.data iterator (one host call)."""
    if n:
        _advance_loop(iterator, tf.constant(n, tf.int64))


def input_signature(element_spec, per_replica_batch: int, micro_batches: int, replicas: int, input_id: str) -> str:
    """What identifies a training input for resuming its position: the data (input_id, e.g. its files),
    the batch shapes and dtypes (seq length, predictions per sequence, packing) and how it is split."""
    shapes = {}

    def visit(spec, path):
        if isinstance(spec, dict):
            for key in sorted(spec):
                visit(spec[key], f"{path}/{key}" if path else str(key))
        elif isinstance(spec, (tuple, list)):
            for i, item in enumerate(spec):
                visit(item, f"{path}/{i}" if path else str(i))
        else:
            shapes[path] = (spec.dtype.name, spec.shape.as_list())

    visit(element_spec, "")
    return json.dumps(dict(data=input_id, batch=per_replica_batch, micro_batches=micro_batches, replicas=replicas,
                           features=shapes), sort_keys=True)


# The features whose nonzero entries are a batch's real tokens, by preference (packed rows: sequence_ids).
MASK_FEATURES = ("input_mask", "sequence_ids")


def _mask_feature(element_spec) -> Optional[str]:
    """The batch's real-token feature (MASK_FEATURES), None for batches without one (not a dict)."""
    if isinstance(element_spec, dict):
        for key in MASK_FEATURES:
            if key in element_spec:
                return key
    return None


def _health_scalars(health, steps: int, seconds: float, examples_per_second_per_replica: float) -> Dict[str, float]:
    """The speed and input scalars of one host loop (TensorBoard: speed/..., input/...), see
    Trainer._make_train_loop for what the input wait measures."""
    wait = float(health["input_wait_seconds"])
    out = {
        "speed/seconds_per_step": seconds / steps,
        "speed/input_wait_seconds_per_step": wait / steps,
        "speed/compute_seconds_per_step": max(seconds - wait, 0.0) / steps,
        "speed/input_wait_fraction": min(wait / max(seconds, 1e-9), 1.0),
        "speed/examples_per_second_per_replica": examples_per_second_per_replica,
    }
    positions = float(health["positions"])
    if positions:
        out["input/real_tokens_per_position"] = float(health["real_tokens"]) / positions
    return out


def _signature_change(old: str, new: str) -> str:
    """The keys in which two input signatures differ, for the resume log line."""
    if not old:
        return "the checkpoint predates input signatures"
    try:
        a, b = json.loads(old), json.loads(new)
    except json.JSONDecodeError:
        return "unreadable signature"
    changed = [k for k in sorted(b) if a.get(k) != b[k]]
    if "features" in changed:
        fa, fb = a.get("features", {}), b["features"]
        diffs = [f"{k} {fa.get(k, [None, None])[1]} -> {fb[k][1]}" for k in sorted(fb) if fa.get(k) != fb[k]]
        changed[changed.index("features")] = "shapes: " + ", ".join(diffs[:3])
    return "; ".join(changed)


def _model_config(model):
    """The model's BertConfig (the model's or its encoder's), or None."""
    for obj in (model, getattr(model, "encoder", None)):
        config = getattr(obj, "config", None)
        if hasattr(config, "to_json_string"):
            return config
    return None


def _model_config_json(model) -> str:
    """The model's BertConfig as JSON (the model's or its encoder's), else its Keras config."""
    config = _model_config(model)
    if config is not None:
        return config.to_json_string()
    try:
        return json.dumps(model.get_config(), indent=2, sort_keys=True, default=str)
    except (NotImplementedError, TypeError, ValueError):
        return f"{type(model).__name__} (no config)"


def _peer_detail(error: BaseException) -> str:
    """The line of a collective's error that says what happened (its first line is "Graph execution error:")."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "aborted by" in line or "unavailable" in line.lower() or "deadline" in line.lower():
            return line[:200]
    return lines[0][:200] if lines else type(error).__name__


def _first_line(error: BaseException) -> str:
    """The first line of an error without TensorFlow's op wrapping ({{function_node ...}}, [Op:SaveV2])."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    line = re.sub(r"\s*\[Op:\w+\].*$", "", re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line))
    return line or type(error).__name__


def _format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"
