"""The training step: what XLA compiles and nothing else (docs/design.md, "The step apart from the loop").

`TrainStep` holds, for one model, loss and optimizer:
  * the gradient step of one micro-batch (forward, loss, gradients; `jit_compile` compiles it):
    loss / (replicas x micro-batches), times the float16 loss scale, gradients cast to float32;
  * the replica step: `gradient_accumulation_steps` micro-batches summed, one all-reduce, global-norm
    clipping folded into the optimizer's update, float16 dynamic loss scaling (skip the update and
    halve on overflow);
  * the evaluation step's metric terms.
With `whole_step` (the scripts' default on one GPU) the replica step itself is one XLA program: forward, loss,
gradients, clipping and the optimizer update (and the loss-scale update) compiled together, instead
of the gradient step and the optimizer's own update programs apart. One device only: the all-reduce
then has nothing to reduce, and the update is the same arithmetic as the default's.
With `steps_per_program` K > 1 one XLA program runs K whole steps over a stack of K batches in a
while loop on the device (`program_fn`): the host launches one program per K steps. Each inner step is
the whole step itself, so the weights, optimizer slots and iteration (the learning rate), dropout's
seed states and the loss scale advance per step as with K programs of one step.
Metrics travel as (value x weight, weight) terms so that sums over steps and replicas average with
the weights (e.g. masked-LM accuracy over real predictions). No directory, checkpoint, summary
writer or host clock is seen here: the loop (inner_loop.py) runs these steps, the Trainer (loop.py)
decides when and what to keep.
"""

from __future__ import annotations

import contextlib
from typing import Dict

import keras
import tensorflow as tf

from bert_tf.training import optimizer as optimizer_lib
from bert_tf.training.settings import PRECISIONS

# Dynamic loss scaling for float16 (the usual values: start high, halve on
# overflow, double after this many finite steps).
INITIAL_LOSS_SCALE = 2.0**15
LOSS_SCALE_GROWTH_STEPS = 2000


@contextlib.contextmanager
def dtype_policy(precision: str):
    """Keras' global dtype policy for building a model in `precision`, restored afterwards."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(PRECISIONS[precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


class LossScale(tf.Module):
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


def dummy_batch(spec):
    """Zeros shaped like one element of `spec` with batch size 1 (builds models, finds metric names)."""

    def zeros(s):
        shape = [1 if d is None else d for d in s.shape.as_list()]
        return tf.zeros(shape, s.dtype)

    return tf.nest.map_structure(zeros, spec)


def metric_terms(metrics: Dict) -> Dict[str, tuple]:
    """{name: value or (value, weight)} -> {name: (value * weight, weight)} float32."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, (tuple, list)):
            v, w = (tf.cast(x, tf.float32) for x in value)
        else:
            v, w = tf.cast(value, tf.float32), tf.constant(1.0)
        out[name] = (v * w, w)
    return out


class TrainStep:
    """One replica's training and evaluation step for a model, its loss_fn and its optimizer.

    Args:
      strategy: the tf.distribute strategy the steps run under (its replica count scales the loss).
      model, optimizer, loss_fn: as the Trainer's (loss_fn(model, batch, training) -> (loss, metrics)).
      micro_batches: gradient accumulation: a training batch holds this many micro-batches ([k, ...]).
      clip_norm: global-norm clipping of the summed gradients (0: none).
      jit_compile: XLA-compile the gradient step and the evaluation step.
      loss_scale: a LossScale (float16) or None.
      whole_step: compile the whole replica step (update included) as one XLA program (needs
        jit_compile and one replica).
      steps_per_program: K whole steps per compiled program (needs whole_step): replica_step then takes
        batches stacked [K, ...] and returns the K losses and gradient norms.
    """

    def __init__(self, strategy, model, optimizer, loss_fn, *, micro_batches: int, clip_norm: float,
                 jit_compile: bool, loss_scale=None, whole_step: bool = False, steps_per_program: int = 1):
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.micro_batches = micro_batches
        self.clip_norm = clip_norm
        self.loss_scale = loss_scale
        # No autograph inside a step: converting the model, loss and optimizer code costs
        # seconds of tracing and they have no tensor-dependent Python control flow
        # (a loss_fn that needs some uses tf.cond / keras.ops.cond).
        self.grad_fn = tf.function(self.compute_grads, jit_compile=jit_compile, autograph=False)
        self.eval_fn = tf.function(self.eval_terms, jit_compile=jit_compile, autograph=False)
        if whole_step and not jit_compile:
            raise ValueError("whole_step compiles the step with XLA: it needs jit_compile")
        if whole_step and strategy.num_replicas_in_sync != 1:
            raise ValueError(f"whole_step runs on one device, not {strategy.num_replicas_in_sync} replicas")
        # The gradient step and the update's programs are inlined into the one compiled function.
        self.whole_step_fn = (tf.function(self._replica_step, jit_compile=True, autograph=False)
                              if whole_step else None)
        if steps_per_program > 1 and not whole_step:
            raise ValueError("steps_per_program runs whole steps in one XLA program: it needs whole_step")
        self.steps_per_program = steps_per_program
        self.program_fn = (tf.function(self._program, jit_compile=True, autograph=False)
                           if steps_per_program > 1 else None)
        self._metric_names = None  # (metric_names(): the K-step program's sums start from them)

    def compute_grads(self, batch):
        """One micro-batch: (loss, metric terms, grads of loss / (replicas * micro-batches))."""
        with tf.GradientTape() as tape:
            loss, metrics = self.loss_fn(self.model, batch, training=True)
            loss = tf.cast(loss, tf.float32)
            scaled = loss / float(self.strategy.num_replicas_in_sync * self.micro_batches)
            if self.loss_scale is not None:
                scaled = scaled * self.loss_scale.scale
        grads = tape.gradient(scaled, self.model.trainable_variables)
        grads = [tf.zeros(v.shape, tf.float32) if g is None else tf.cast(tf.convert_to_tensor(g), tf.float32)
                 for g, v in zip(grads, self.model.trainable_variables, strict=True)]
        if self.loss_scale is not None:
            grads = [g / self.loss_scale.scale for g in grads]
        return loss, metric_terms(metrics), grads

    @tf.autograph.experimental.do_not_convert
    def replica_step(self, batch):
        """One optimizer step on this replica's batch (inside strategy.run): (loss, metric terms, gradient norm);
        with steps_per_program K > 1, K steps on batches stacked [K, ...]: (losses [K], metric terms summed
        over the K steps, gradient norms [K])."""
        if self.program_fn is not None:
            return self.program_fn(batch)
        if self.whole_step_fn is not None:
            return self.whole_step_fn(batch)
        return self._replica_step(batch)

    def _program(self, batches):
        """K whole steps in one XLA while loop: step i trains on batches[i]. The loop's body is the whole
        step, compiled once (not K copies: the compile time of one step); the variables it assigns (weights,
        slots, optimizer iteration, seed states, loss scale) carry from one iteration to the next."""
        k = self.steps_per_program
        if self._metric_names is None:
            raise RuntimeError("the K-step program sums the metrics metric_names() found: call it first")
        zero = tf.constant(0.0)
        sums = {name: (zero, zero) for name in self._metric_names}

        def body(i, losses, sums, norms):
            loss, terms, norm = self._replica_step(tf.nest.map_structure(lambda t: t[i], batches))
            return i + 1, losses.write(i, loss), tf.nest.map_structure(tf.add, sums, terms), norms.write(i, norm)

        start = (tf.constant(0), tf.TensorArray(tf.float32, size=k), sums, tf.TensorArray(tf.float32, size=k))
        _, losses, sums, norms = tf.while_loop(lambda i, *_: i < k, body, start, maximum_iterations=k)
        return losses.stack(), sums, norms.stack()

    def _replica_step(self, batch):
        k = self.micro_batches
        if k == 1:
            loss, terms, grads = self.grad_fn(batch)
        else:
            # batch: every tensor [k, micro_batch, ...]; grads and metrics are summed over the k slices.
            loss, terms, grads = self.grad_fn(tf.nest.map_structure(lambda t: t[0], batch))
            for j in range(1, k):  # k calls of one traced function: the graph grows by k call ops only
                l_j, t_j, g_j = self.grad_fn(tf.nest.map_structure(lambda t, j=j: t[j], batch))
                loss += l_j
                terms = tf.nest.map_structure(tf.add, terms, t_j)
                grads = [a + b for a, b in zip(grads, g_j, strict=True)]
            loss /= float(k)
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        clip_scale, grad_norm = optimizer_lib.global_norm_clip_scale(grads, self.clip_norm)
        finite = None
        if self.loss_scale is not None:
            finite = tf.math.is_finite(grad_norm)
            # Every replica holds the same all-reduced `finite`; the update runs once, cross-replica.
            ctx.merge_call(lambda strategy, f: self.loss_scale.update(strategy.experimental_local_results(f)[0]),
                           args=(finite,))
        self.optimizer.apply_gradients(grads, apply=finite, grad_scale=clip_scale)
        return loss, terms, grad_norm

    def eval_terms(self, batch):
        """The evaluation metrics' terms of one batch (training=False), `loss` among them."""
        loss, metrics = self.loss_fn(self.model, batch, training=False)
        metrics = dict(metrics)
        metrics.setdefault("loss", loss)
        return metric_terms(metrics)

    def metric_names(self, element_spec) -> list:
        """The sorted metric names loss_fn returns for batches of `element_spec` (one call on zeros)."""
        with self.strategy.scope():
            _, metrics = self.loss_fn(self.model, dummy_batch(element_spec), training=False)
        self._metric_names = sorted(metrics)
        return self._metric_names
