"""The original BERT optimizer (docs/reference.md §4), LAMB, and the learning-rate schedule.

The optimizers here are small `tf.Module`s rather than `keras.optimizers`:
the training loop all-reduces gradients once, clips them by global norm (the
original clips before the update) and then applies them, and a Keras
optimizer would all-reduce a second time inside `apply_gradients`. Slot
variables are created eagerly, under the distribution strategy's scope, so
`tf.train.Checkpoint` saves and restores them with the model.

Update of `AdamWeightDecay` for a parameter w with gradient g (no bias
correction, decoupled weight decay, exactly the original's):
    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
    w -= lr * (m / (sqrt(v) + eps) + wd * w)        (wd = 0 for excluded names)
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Optional, Sequence

import tensorflow as tf

from bert_tf.training.settings import CLIP_NORM, OPTIMIZERS, WEIGHT_DECAY_RATE  # noqa: F401  (their home)

# docs/reference.md §4: the original's AdamWeightDecayOptimizer hyper-parameters.
ADAM_BETA_1 = 0.9
ADAM_BETA_2 = 0.999
ADAM_EPSILON = 1e-6
# Substrings of a variable's path that exempt it from weight decay (and, for
# LAMB, from the layer-wise trust ratio), as in the original.
EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")

# Variables are updated in groups of consecutive variables holding at most this many elements in
# all (a larger variable is a group of its own), one XLA call per group: BERT-base's 206 variables
# in 14 calls instead of 206. The group's new values (variables and slots) exist at once before
# they are assigned, so the limit bounds that extra memory (8M float32 elements x 3 = 96 MiB; the
# per-variable update already needs 3 x the largest variable, BERT's 23.4M-element embedding table).
MAX_GROUP_ELEMENTS = 8 * 1024 * 1024


def variable_path(variable) -> str:
    """The name the exclusion patterns match against: a Keras variable's path
    (`bert/layer_0/attention_LayerNorm/gamma`), or a tf.Variable's name."""
    path = getattr(variable, "path", None)
    if path:
        return path
    return variable.name.split(":")[0]


class WarmupLinearDecay:
    """lr(step) = peak * step / warmup           while step < warmup,
                  peak * (1 - min(step, total) / total) afterwards.

    The decay is measured from step 0, not from the end of the warmup (the
    original's polynomial_decay(power=1) then a warmup override). `step` is
    the number of updates applied before this one, so the first update of a
    run with warmup uses lr 0, as in the original.
    """

    def __init__(self, peak_learning_rate: float, num_train_steps: int, num_warmup_steps: int = 0):
        if num_train_steps <= 0:
            raise ValueError(f"num_train_steps must be positive, got {num_train_steps}")
        if num_warmup_steps < 0:
            raise ValueError(f"num_warmup_steps must be >= 0, got {num_warmup_steps}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.num_warmup_steps = int(num_warmup_steps)
        # Tensors made here, not Python numbers: a compiled program that computes the rate (the whole
        # step as one XLA program) captures them as inputs instead of folding them in as constants, so
        # a run resumed to more steps is the same program and loads it from the XLA cache (xla_cache.py).
        self._peak, self._total, self._warmup = (tf.constant(float(v), tf.float32) for v in (
            peak_learning_rate, num_train_steps, num_warmup_steps))

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        decayed = self._peak * (1.0 - tf.minimum(step, self._total) / self._total)
        if not self.num_warmup_steps:
            return decayed
        warmup = self._peak * step / self._warmup
        return tf.where(step < self._warmup, warmup, decayed)


class _Untracked:
    def __init__(self, value):
        self.value = value


def group_variables(sizes: Sequence[Optional[int]], max_group_elements: int) -> list[list[int]]:
    """Indices of consecutive variables in groups of at most max_group_elements elements in all; a
    variable larger than that (or of unknown size) is a group of its own; max_group_elements <= 0:
    one group per variable."""
    groups: list[list[int]] = []
    total = 0
    for i, size in enumerate(sizes):
        if max_group_elements <= 0 or size is None or not groups or total + size > max_group_elements:
            groups.append([i])
            total = max_group_elements + 1 if size is None else size
        else:
            groups[-1].append(i)
            total += size
    return groups


def _unless_skipped(apply, new_var, new_slots, var, slots):
    """(new_var, new_slots), or the old values where `apply` (bool scalar or None) is False."""
    if apply is None:
        return new_var, list(new_slots)
    return tf.where(apply, new_var, var), [tf.where(apply, n, s) for n, s in zip(new_slots, slots, strict=True)]


def _times(lr, scale: float):
    """lr * a variable's learning-rate scale (no multiply for the common 1.0)."""
    return lr if scale == 1.0 else lr * scale


def _unwrap(variable):
    """The tf.Variable behind a Keras variable (what strategy.extended.update expects)."""
    if hasattr(variable, "value") and not isinstance(variable, tf.Variable):
        return variable.value
    return variable


def _groups_allowed(strategy, variables) -> bool:
    """Whether the grouped update may run in `strategy`'s cross-replica context. Only with one
    device holding plain variables: strategy.extended.update takes ONE variable and runs the update
    on each device that holds a copy of it (MirroredStrategy, TPU, multi-worker), so a group's
    single XLA call would have to be made per device, with each device's copies as inputs: those
    strategies keep the per-variable update."""
    return isinstance(strategy, tf.distribute.OneDeviceStrategy) and not any(
        isinstance(v, tf.distribute.DistributedValues) for v in variables)


class _SlotOptimizer(tf.Module):
    """Shared plumbing: per-variable slots, decay exclusions, distributed apply."""

    slot_names: Sequence[str] = ()

    def __init__(
        self,
        variables,
        learning_rate: Callable[[tf.Tensor], tf.Tensor],
        weight_decay_rate: float,
        exclude_from_weight_decay: Sequence[str],
        name: str,
        max_group_elements: int = MAX_GROUP_ELEMENTS,
        learning_rate_scales: Optional[Sequence[float]] = None,
    ):
        super().__init__(name=name)
        self.learning_rate = learning_rate
        self.weight_decay_rate = float(weight_decay_rate)
        self.exclude_from_weight_decay = tuple(exclude_from_weight_decay)
        # Counts applied updates; the schedule reads it (it is the original's global_step).
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        # Held outside tf.Module's attribute tracking: the model owns (and
        # checkpoints) these variables.
        self._holder = _Untracked(list(variables))
        # One list per slot, aligned with the variables; a list of variables is
        # checkpointed by position, which is stable for a given model.
        self.slots = {
            slot: [
                tf.Variable(tf.zeros(v.shape, dtype=tf.float32), trainable=False, name=f"{slot}")
                for v in self._variables
            ]
            for slot in self.slot_names
        }
        self._decay = [self._use_weight_decay(variable_path(v)) for v in self._variables]
        # Each variable's rate is the schedule's times its scale (1.0 for all but, e.g., a task head
        # given its own rate: TrainSettings.head_learning_rate); a Python float, bound like the decay flag.
        scales = [1.0] * len(self._variables) if learning_rate_scales is None else [float(x) for x in learning_rate_scales]
        if len(scales) != len(self._variables) or any(x <= 0 for x in scales):
            raise ValueError(f"learning_rate_scales must be {len(self._variables)} positive numbers, one per variable")
        self._lr_scales = scales
        # The update's element-wise ops compiled together (XLA), the same arithmetic in one pass
        # over each tensor instead of one pass per op: half the CPU time of the update in graph
        # mode on CPU (BERT-small: 0.13 vs 0.27 s a step, a fifth of a short fine-tuning step).
        self._fused_update = tf.function(self._scaled_update, jit_compile=True, autograph=False,
                                         reduce_retracing=True)
        # And one XLA call per group of variables (MAX_GROUP_ELEMENTS) instead of one per variable:
        # fewer launches, and more independent work per call for XLA's threads. BERT-base update
        # with the global-norm clip on 2 CPU cores: AdamW 232 -> 212 ms, LAMB 389 -> 362 ms; the
        # first call compiles for ~8 s longer. One tf.function per group, its members' decay flags
        # bound: each traces once (per `apply` kind).
        self.max_group_elements = int(max_group_elements)
        groups = group_variables([v.shape.num_elements() for v in self._variables], self.max_group_elements)
        if all(len(g) == 1 for g in groups):
            groups = []  # nothing to group: the per-variable update
        self._groups = _Untracked(groups)
        self._group_updates = _Untracked([
            tf.function(_named(functools.partial(self._group_update, tuple(self._decay[i] for i in g),
                                                 tuple(self._lr_scales[i] for i in g)),
                               f"optimizer_group_update_{k}"), jit_compile=True, autograph=False)
            for k, g in enumerate(groups)
        ])

    @property
    def _variables(self):
        return self._holder.value

    def _use_weight_decay(self, name: str) -> bool:
        if not self.weight_decay_rate:
            return False
        return not any(re.search(p, name) for p in self.exclude_from_weight_decay)

    def decayed_variable_names(self):
        return [variable_path(v) for v, d in zip(self._variables, self._decay, strict=True) if d]

    def current_learning_rate(self) -> tf.Tensor:
        return self.learning_rate(self.iterations)

    def last_learning_rate(self) -> tf.Tensor:
        """The rate the most recent update used (the first step's before any update)."""
        return self.learning_rate(tf.maximum(self.iterations - 1, 0))

    def apply_gradients(self, grads, apply=None, grad_scale=None) -> None:
        """Applies one update with grads * grad_scale (a float32 scalar, e.g. the global-norm clip
        factor: multiplied inside each variable's fused update instead of a pass of its own over
        every gradient); `grads` align with the constructor's variables.

        In a replica context (inside `strategy.run`) the grads must already be
        all-reduced: every replica then writes the same values to its copy.
        `apply` (bool scalar, optional) skips the update when False (float16
        loss scaling found non-finite gradients); the step still counts.
        """
        lr = tf.convert_to_tensor(self.current_learning_rate())
        grad_scale = tf.constant(1.0) if grad_scale is None else tf.cast(grad_scale, tf.float32)
        if apply is not None:
            apply = tf.convert_to_tensor(apply)
            grads = [tf.where(apply, g, tf.zeros_like(g)) for g in grads]
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and tf.distribute.has_strategy():
            ctx.merge_call(self._distributed_apply, args=(grads, lr, grad_scale, apply))
        else:
            self._apply_all(grads, lr, grad_scale, apply)

    def group_tracing_count(self) -> int:
        """How many times the group update functions were traced (once per group and `apply`
        kind, None or a tensor, when nothing retraces)."""
        return sum(f.experimental_get_tracing_count() for f in self._group_updates.value)

    def _distributed_apply(self, strategy, grads, lr, grad_scale, apply):
        variables = [_unwrap(v) for v in self._variables]
        if self._groups.value and _groups_allowed(strategy, variables):
            # One device: the group runs there, in the strategy's update context (as
            # strategy.extended.update runs a single variable's update), colocated with its first member.
            ops = [
                strategy.extended.update(
                    variables[group[0]],
                    lambda _, k=k: self._apply_group(k, variables, grads, lr, grad_scale, apply),
                    group=False)
                for k, group in enumerate(self._groups.value)
            ]
            with tf.control_dependencies(tf.nest.flatten(ops)):
                strategy.extended.update(self.iterations, lambda it: it.assign_add(1), group=False)
            return
        ops = []
        for i, (g, var) in enumerate(zip(grads, variables, strict=True)):
            slots = [self.slots[s][i] for s in self.slot_names]
            ops.append(
                strategy.extended.update(var, self._update, args=(g, self._scaled_lr(lr, i), grad_scale, apply,
                                                                  self._decay[i], *slots), group=False)
            )
        with tf.control_dependencies(tf.nest.flatten(ops)):
            strategy.extended.update(self.iterations, lambda it: it.assign_add(1), group=False)

    def _apply_all(self, grads, lr, grad_scale, apply):
        if self._groups.value:
            for k in range(len(self._groups.value)):
                self._apply_group(k, self._variables, grads, lr, grad_scale, apply)
            self.iterations.assign_add(1)
            return
        for i, (g, v) in enumerate(zip(grads, self._variables, strict=True)):
            slots = [self.slots[s][i] for s in self.slot_names]
            self._update(v, g, self._scaled_lr(lr, i), grad_scale, apply, self._decay[i], *slots)
        self.iterations.assign_add(1)

    def _scaled_lr(self, lr, i):
        return _times(lr, self._lr_scales[i])

    def _update(self, var, grad, lr, grad_scale, apply, decay, *slots):
        new_var, new_slots = self._fused_update(tf.convert_to_tensor(var), tf.cast(grad, tf.float32), grad_scale, lr,
                                                decay, *[tf.convert_to_tensor(s) for s in slots])
        new_var, new_slots = _unless_skipped(apply, new_var, new_slots, var, slots)
        for slot, value in zip(slots, new_slots, strict=True):
            slot.assign(value)
        return var.assign(new_var)

    def _apply_group(self, k, variables, grads, lr, grad_scale, apply):
        """Updates group k in one XLA call (`_group_update`), then assigns; -> the assign ops."""
        members = self._groups.value[k]
        slots = [[self.slots[s][i] for i in members] for s in self.slot_names]
        new_vars, new_slots = self._group_updates.value[k](
            [tf.convert_to_tensor(variables[i]) for i in members],
            [tf.cast(grads[i], tf.float32) for i in members],
            grad_scale, lr, apply,
            *[[tf.convert_to_tensor(s) for s in slot] for slot in slots])
        ops = []
        for slot, values in zip(slots, new_slots, strict=True):
            ops += [s.assign(value) for s, value in zip(slot, values, strict=True)]
        ops += [variables[i].assign(value) for i, value in zip(members, new_vars, strict=True)]
        return ops

    def _group_update(self, decays, scales, variables, grads, grad_scale, lr, apply, *slots):
        """The members' `_scaled_update`s in one function (the same ops per member as the
        per-variable update, so the same numbers; LAMB's trust ratio stays per member); `apply`
        False keeps the old values. -> (new variables, [new values of each slot])."""
        new_vars, new_slots = [], [[] for _ in slots]
        for j, (var, grad, decay, scale) in enumerate(zip(variables, grads, decays, scales, strict=True)):
            old_slots = [slot[j] for slot in slots]
            new_var, values = self._scaled_update(var, grad, grad_scale, _times(lr, scale), decay, *old_slots)
            new_var, values = _unless_skipped(apply, new_var, values, var, old_slots)
            new_vars.append(new_var)
            for out, value in zip(new_slots, values, strict=True):
                out.append(value)
        return new_vars, new_slots

    def _scaled_update(self, var, grad, grad_scale, lr, decay, *slots):
        return self._compute_update(var, grad * grad_scale, lr, decay, *slots)

    def _compute_update(self, var, grad, lr, decay, *slots):
        """-> (new value of var, new values of the slots); float32 grad."""
        raise NotImplementedError


class _AdamMoments(_SlotOptimizer):
    """Adam's two moment slots m and v (beta_1, beta_2, epsilon): the base of AdamWeightDecay and Lamb, each
    named after its class unless `name` says otherwise."""

    slot_names = ("m", "v")

    def __init__(
        self,
        variables,
        learning_rate,
        weight_decay_rate: float = WEIGHT_DECAY_RATE,
        beta_1: float = ADAM_BETA_1,
        beta_2: float = ADAM_BETA_2,
        epsilon: float = ADAM_EPSILON,
        exclude_from_weight_decay: Sequence[str] = EXCLUDE_FROM_WEIGHT_DECAY,
        name: Optional[str] = None,
        max_group_elements: int = MAX_GROUP_ELEMENTS,
        learning_rate_scales: Optional[Sequence[float]] = None,
    ):
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        super().__init__(variables, learning_rate, weight_decay_rate, exclude_from_weight_decay,
                         name or type(self).__name__, max_group_elements, learning_rate_scales)

    def _moments(self, grad, m, v):
        """-> the moments after `grad`: (next m, next v)."""
        return self.beta_1 * m + (1.0 - self.beta_1) * grad, self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)


class AdamWeightDecay(_AdamMoments):
    """The original BERT optimizer: Adam without bias correction, decoupled weight decay."""

    def _compute_update(self, var, grad, lr, decay, m, v):
        next_m, next_v = self._moments(grad, m, v)
        update = next_m / (tf.sqrt(next_v) + self.epsilon)
        if decay:
            update += self.weight_decay_rate * var
        return var - tf.cast(lr, var.dtype) * update, (next_m, next_v)


class Lamb(_AdamMoments):
    """LAMB (You et al. 2019, Algorithm 2) for large-batch pretraining.

    Adam moments with bias correction, decoupled weight decay, then a
    per-variable trust ratio ||w|| / ||update|| (1 when either norm is 0, and
    for the excluded names, as in the NVIDIA / MLPerf BERT recipes).
    """

    def _compute_update(self, var, grad, lr, decay, m, v):
        t = tf.cast(self.iterations + 1, tf.float32)
        next_m, next_v = self._moments(grad, m, v)
        m_hat = next_m / (1.0 - tf.pow(self.beta_1, t))
        v_hat = next_v / (1.0 - tf.pow(self.beta_2, t))
        update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        ratio = 1.0
        if decay:
            update += self.weight_decay_rate * var
            w_norm = tf.norm(var)
            u_norm = tf.norm(update)
            ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
        return var - tf.cast(lr * ratio, var.dtype) * update, (next_m, next_v)


def create_optimizer(
    name: str,
    variables,
    learning_rate: float,
    num_train_steps: int,
    num_warmup_steps: int = 0,
    weight_decay_rate: float = WEIGHT_DECAY_RATE,
    schedule: Optional[Callable] = None,
    learning_rate_scales: Optional[Sequence[float]] = None,
):
    """`adamw` (the original) or `lamb`, with the warmup + linear decay schedule; learning_rate_scales:
    one factor per variable on the schedule's rate (None: 1 for every variable)."""
    schedule = schedule or WarmupLinearDecay(learning_rate, num_train_steps, num_warmup_steps)
    if name == "adamw":
        return AdamWeightDecay(variables, schedule, weight_decay_rate=weight_decay_rate,
                               learning_rate_scales=learning_rate_scales)
    if name == "lamb":
        return Lamb(variables, schedule, weight_decay_rate=weight_decay_rate, learning_rate_scales=learning_rate_scales)
    raise ValueError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}")


def global_norm_clip_scale(grads, clip_norm: float = CLIP_NORM):
    """Returns (scale, global norm): grads * scale are the grads clipped to global norm clip_norm,
    as tf.clip_by_global_norm (scale = clip_norm / max(norm, clip_norm)); clip_norm <= 0: scale 1."""
    norm = tf.linalg.global_norm(grads)
    if not clip_norm or clip_norm <= 0:
        return tf.constant(1.0), norm
    return clip_norm / tf.maximum(norm, clip_norm), norm


def clip_by_global_norm(grads, clip_norm: float = CLIP_NORM):
    """Returns (clipped grads, global norm before clipping); clip_norm <= 0 disables clipping."""
    scale, norm = global_norm_clip_scale(grads, clip_norm)
    return [g * tf.cast(scale, g.dtype) for g in grads], norm


def _named(fn, name: str):
    """`fn` (a functools.partial) named `name`: its tf.function's graph and XLA program carry the name
    into profiles (a partial's would be 'function'), so a trace's kernels say they are the update's."""
    fn.__name__ = name
    return fn


def optimizer_fn(settings, train_steps: int, warmup_steps: int) -> Callable:
    """(trainable variables, head variables) -> the optimizer `settings` (a TrainSettings) asks for: warmup then
    linear decay to 0 at `train_steps`; the head's variables (a subset, matched by path) at its
    head_learning_rate when set."""

    def make(variables, head_variables=()):
        scales = None
        if settings.head_learning_rate is not None and head_variables:
            head = {variable_path(v) for v in head_variables}
            factor = settings.head_learning_rate / settings.learning_rate
            scales = [factor if variable_path(v) in head else 1.0 for v in variables]
        return create_optimizer(settings.optimizer, variables, settings.learning_rate, train_steps, warmup_steps,
                                weight_decay_rate=settings.weight_decay_rate, learning_rate_scales=scales)

    return make
