"""How steps are run: N training steps per host call, and the evaluation batches (the inner loop).

The Trainer (loop.py) asks for a number of steps and gets their outputs back; it never sees the
graph. `make_train_loop` builds the `tf.function` that runs `num_steps` replica steps (step.py) in a
`tf.range` loop over a dataset iterator, summing the metric terms over steps and replicas;
`run_host_loop` calls it, running a process's first step alone (the call that traces and compiles);
`evaluate_batches` runs the evaluation step over a dataset. No checkpoint, summary or directory here.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, Optional

import numpy as np
import tensorflow as tf

from bert_tf.training import xla_cache

# The features whose nonzero entries are a batch's real tokens, by preference (packed rows: sequence_ids).
MASK_FEATURES = ("input_mask", "sequence_ids")


def mask_feature(element_spec) -> Optional[str]:
    """The batch's real-token feature (MASK_FEATURES), None for batches without one (not a dict)."""
    if isinstance(element_spec, dict):
        for key in MASK_FEATURES:
            if key in element_spec:
                return key
    return None


def make_train_loop(strategy, replica_step: Callable, metric_names, mask_key: Optional[str], clock_input: bool = True,
                    steps_per_program: int = 1):
    """The host call of `num_steps` steps: (losses, metric sums, mean gradient norm, health), where
    health = {input_wait_seconds: time the loop was blocked in the input iterator's get_next,
    summed over the steps; real_tokens, positions: nonzero entries of the batches' `mask_key`
    feature (input_mask, or packed rows' sequence_ids) and all its entries}.

    replica_step(batch) -> (loss, metric terms, gradient norm) runs under strategy.run (TrainStep.replica_step).

    The wait is measured in the graph with tf.timestamp: each step's clock starts once the
    previous step's outputs exist, and stops when the next batch is there. It is host time: on a
    GPU/TPU, whose kernels run asynchronously, a step's device work may still run while the next
    get_next waits, so there the wait is that of the host (as in tf.data's own accounting).

    clock_input False: no clock, input_wait_seconds NaN (not measured). The clock makes the host wait for
    each step's outputs before it asks for the next batch and enqueues the next step, so an accelerator
    idles between steps for the host's share of a step (TrainSettings.input_wait_clock).

    steps_per_program K > 1: each element of the iterator stacks K batches [K, ...] and replica_step runs
    the K steps (TrainStep.program_fn) -> (losses [K], metric terms summed over them, gradient norms [K]);
    num_steps (a multiple of K) still counts steps, the loop makes num_steps / K calls, the wait is clocked
    per program and the tokens are counted over the stack."""
    names = list(metric_names)

    def count_tokens(batch):
        mask = tf.cast(tf.not_equal(batch[mask_key], 0), tf.float32)
        return tf.reduce_sum(mask), tf.cast(tf.size(mask), tf.float32)

    k = steps_per_program

    @tf.function
    def train_loop(iterator, num_steps):
        losses = tf.TensorArray(tf.float32, size=num_steps // k, element_shape=[k])
        sums = {n: (tf.constant(0.0), tf.constant(0.0)) for n in names}
        norm_sum = tf.constant(0.0)
        wait, real, positions = tf.constant(0.0, tf.float64), tf.constant(0.0), tf.constant(0.0)
        done = tf.constant(0.0)  # a value of the previous step: the next step's clock starts after it
        for i in tf.range(num_steps // k):
            if clock_input:
                with tf.control_dependencies([done]):
                    asked = tf.timestamp()
                with tf.control_dependencies([asked]):
                    batch = next(iterator)
                with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                    wait += tf.timestamp() - asked
            else:
                batch = next(iterator)
            loss, terms, norm = strategy.run(replica_step, args=(batch,))
            loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)
            # One reduce per tensor: MultiWorkerMirroredStrategy's reduce rejects a nested structure.
            terms = tf.nest.map_structure(
                lambda t: strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None), terms)
            sums = tf.nest.map_structure(tf.add, sums, terms)
            norm = strategy.reduce(tf.distribute.ReduceOp.MEAN, norm, axis=None)
            norm_sum += tf.reduce_sum(norm)
            losses = losses.write(i, tf.reshape(loss, [k]))
            if mask_key is not None:
                r, p = strategy.run(count_tokens, args=(batch,))
                real += strategy.reduce(tf.distribute.ReduceOp.SUM, r, axis=None)
                positions += strategy.reduce(tf.distribute.ReduceOp.SUM, p, axis=None)
            if clock_input:
                done = tf.reduce_sum(loss) + tf.reduce_sum(norm)
        if not clock_input:
            wait = tf.constant(float("nan"), tf.float64)
        health = dict(input_wait_seconds=wait, real_tokens=real, positions=positions)
        return tf.reshape(losses.stack(), [-1]), sums, norm_sum / tf.cast(num_steps, tf.float32), health

    return train_loop


def run_host_loop(train_loop, iterator, n: int, compiling: bool, first_steps: int = 1):
    """Runs `n` steps through make_train_loop's function -> (losses [n] numpy, metric sums,
    mean gradient norm, health floats, seconds of the timed steps, seconds of the first step or 0).

    compiling: the first `first_steps` steps (one step, or one program of steps_per_program steps) run as a
    call of their own (tracing and compiling happen in it) and the rest as a second call; their outputs are
    merged, so the loop's results are those of one call of n steps, while `seconds` and the input wait in
    `health` cover only the n - first_steps steps after the first."""

    def call(steps):
        start = time.time()
        losses, sums, norm, health = train_loop(iterator, tf.constant(steps, tf.int32))
        losses = losses.numpy()  # (waits for the call to finish)
        return losses, sums, float(norm.numpy()) * steps, {k: float(v.numpy()) for k, v in health.items()}, \
            time.time() - start

    if not compiling:
        losses, sums, norm_sum, health, seconds = call(n)
        return losses, sums, norm_sum / n, health, seconds, 0.0
    xla_cache.align_trace_names()  # a resumed run traces its step under a fresh run's names: the cache hits
    losses, sums, norm_sum, health, first_seconds = call(first_steps)
    health["input_wait_seconds"], seconds = 0.0, 0.0
    if n > first_steps:
        more_losses, more_sums, more_norm, more_health, seconds = call(n - first_steps)
        losses = np.concatenate([losses, more_losses])
        sums = tf.nest.map_structure(tf.add, sums, more_sums)
        norm_sum += more_norm
        health = {k: health[k] + v for k, v in more_health.items()}
    return losses, sums, norm_sum / n, health, seconds, first_seconds


def evaluate_batches(strategy, eval_fn: Callable, dataset, steps: Optional[int]):
    """Runs eval_fn (TrainStep.eval_fn: a batch's metric terms) over up to `steps` batches of the
    distributed `dataset` (all when None) -> ({name: (sum of value x weight, sum of weight)} floats or
    None for no data, batches run, seconds of the first batch (it traces and compiles), seconds of the rest)."""

    @tf.function
    def eval_step(batch):
        terms = strategy.run(eval_fn, args=(batch,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, terms, axis=None)

    totals: Optional[Dict[str, tuple]] = None
    count = 0
    iterator = iter(dataset)
    start = time.time()
    first_seconds = 0.0
    while steps is None or count < steps:
        batch = iterator.get_next_as_optional()
        if not batch.has_value():
            break
        if count == 0:
            xla_cache.align_trace_names()
        terms = eval_step(batch.get_value())
        terms = {k: (float(v.numpy()), float(w.numpy())) for k, (v, w) in terms.items()}
        totals = terms if totals is None else {k: (totals[k][0] + v, totals[k][1] + w)
                                               for k, (v, w) in terms.items()}
        count += 1
        if count == 1:  # the first batch traces and compiles the eval step
            first_seconds, start = time.time() - start, time.time()
    return totals, count, first_seconds, time.time() - start
