"""What each window aggregation computes: one definition, in TensorFlow, over window slots.

Every path that puts windows' outputs back together calls `aggregate_slots`: training on the aggregate
(bert_tf.runners.window_slots: the loss is taken on it, so it must be differentiable and of static shape for
XLA), the export (bert_tf.serving.windows.aggregate: the graph's windows, moved into slots) and evaluation and
prediction (bert_tf.tasks.windows.aggregate_windows: numpy windows, moved into slots by windows_in_slots and
aggregated in float64). The names are bert_tf.tasks.windows.AGGREGATIONS; that module stays TensorFlow-free.

Dimensions: B inputs, K window slots (an input's windows first, then empty slots), L labels (or 1 value).
"""

from __future__ import annotations

import tensorflow as tf

# "any": the first label holds only when every window says so (its probability is the product of the windows'),
# log(1 - that) floored here so a certain first label gives a finite log-probability to the others.
ANY_FLOOR = 1e-30
# A masked slot's logit before max and logmeanexp: far below any real one, finite so no inf - inf appears.
EMPTY_SLOT_LOGIT = -1e9


def aggregate_slots(logits, window_mask, aggregation: str) -> tf.Tensor:
    """float [B, K, L] outputs of each input's window slots, window_mask int [B, K] (1: a window; every input has
    its first slot filled, its windows in order) -> [B, L], in the outputs' dtype:
    "mean"        the mean of its windows' outputs;
    "max"         each output unit's largest value over its windows (a class wins when any window argues for it
                  strongly; under training each unit's gradient goes to its largest window only, ties share it);
    "logmeanexp"  each unit's log(mean(exp(x))) over its windows: a soft maximum between the two, whose sharpness
                  the model sets through the scale of its logits;
    "any"         the first label means "found nowhere": its probability is the product of the windows'
                  probabilities of it (a noisy-OR); the others share the rest in proportion to their log-sum-exp
                  of log-probabilities over the windows; log-probabilities (needs L >= 2);
    "first"       its first window's, what truncation reads.
    An input of one window gives its own outputs under every aggregation ("any" included: its logits, the same
    probabilities as its log-probabilities), so a short input reads as under truncation.
    """
    logits = tf.convert_to_tensor(logits)
    mask = tf.cast(window_mask, logits.dtype)[:, :, None]  # [B, K, 1]
    count = tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)  # [B, 1]
    empty = tf.constant(EMPTY_SLOT_LOGIT, logits.dtype)
    if aggregation == "first":
        return logits[:, 0]
    if aggregation == "mean":
        return tf.reduce_sum(logits * mask, axis=1) / count
    if aggregation == "any":
        return tf.where(count == 1.0, logits[:, 0], _any(logits, mask, empty))
    masked = tf.where(mask > 0, logits, empty)  # [B, K, L]
    top = tf.reduce_max(masked, axis=1)  # [B, L]
    if aggregation == "max":
        return top
    if aggregation == "logmeanexp":  # top + log(mean(exp(x - top))): exact, and no overflow
        return top + tf.math.log(tf.reduce_sum(tf.exp(masked - top[:, None, :]) * mask, axis=1) / count)
    raise ValueError(f"unknown window aggregation {aggregation!r}")


def _any(logits: tf.Tensor, mask: tf.Tensor, empty: tf.Tensor) -> tf.Tensor:
    """aggregate_slots' "any" log-probabilities [B, L] (the noisy-OR), one-window inputs not yet special."""
    if logits.shape[-1] is not None and logits.shape[-1] < 2:
        raise ValueError(f"window aggregation 'any' needs two or more labels, got outputs of shape {logits.shape}")
    logp = tf.nn.log_softmax(logits)  # [B, K, L]
    none = tf.reduce_sum(logp[:, :, :1] * mask, axis=1)  # [B, 1]: log P(first) = the sum of the windows'
    rest = tf.reduce_logsumexp(tf.where(mask > 0, logp[:, :, 1:], empty), axis=1)  # [B, L - 1]
    found = tf.math.log(-tf.math.expm1(tf.minimum(none, -ANY_FLOOR)))  # log(1 - P(first)), [B, 1]
    return tf.concat([none, found + tf.nn.log_softmax(rest)], axis=1)


__all__ = ["ANY_FLOOR", "EMPTY_SLOT_LOGIT", "aggregate_slots"]
