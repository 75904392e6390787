"""Inputs whose windows sit side by side in slots (bert_tf.tasks.windows.windows_in_slots): their logits, their
aggregate (classifier --window_training=aggregate's loss is taken on it), and --window_training=clean_negatives'
loss.

Dimensions: B inputs, K window slots, S max_seq_length, L labels.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.serving.windows import any_outputs

# A masked slot's logit before max and logmeanexp: far below any real one, finite so no inf - inf appears.
EMPTY_SLOT_LOGIT = -1e9


def aggregate_slots(logits: tf.Tensor, window_mask: tf.Tensor, aggregation: str) -> tf.Tensor:
    """float [B, K, L] logits of each input's window slots, window_mask int [B, K] (1: a window) -> [B, L]:
    bert_tf.tasks.windows.aggregate_windows over each input's windows, empty slots left out. Every input has
    its first slot filled. Under max each unit's gradient goes to its largest window only (ties share it)."""
    mask = tf.cast(window_mask, logits.dtype)[:, :, None]  # [B, K, 1]
    count = tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)  # [B, 1]
    if aggregation == "first":
        return logits[:, 0]
    if aggregation == "mean":
        return tf.reduce_sum(logits * mask, axis=1) / count
    if aggregation == "any":  # noisy-OR: the first label only when every window says so
        logp = tf.nn.log_softmax(logits)  # [B, K, L]
        none = tf.reduce_sum(logp[:, :, :1] * mask, axis=1)  # [B, 1]
        rest = tf.reduce_logsumexp(tf.where(mask > 0, logp[:, :, 1:], EMPTY_SLOT_LOGIT), axis=1)  # [B, L - 1]
        return any_outputs(none, rest)
    masked = tf.where(mask > 0, logits, EMPTY_SLOT_LOGIT)  # [B, K, L]
    top = tf.reduce_max(masked, axis=1)  # [B, L]
    if aggregation == "max":
        return top
    if aggregation == "logmeanexp":  # top + log(mean(exp(x - top))): exact, and no overflow
        return top + tf.math.log(tf.reduce_sum(tf.exp(masked - top[:, None, :]) * mask, axis=1) / count)
    raise ValueError(f"window aggregation must be mean, max, logmeanexp, any or first, got {aggregation!r}")


def window_slot_logits(model, batch, training) -> tf.Tensor:
    """The logits float32 [B, K, L] of every window slot of a batch of inputs in window slots ([B, K, S] inputs)."""
    shape = tf.shape(batch["input_ids"])  # [B, K, S]
    windows = {k: tf.reshape(batch[k], [-1, shape[2]]) for k in ("input_ids", "input_mask", "segment_ids")}
    logits = tf.cast(model(windows, training=training), tf.float32)  # [B * K, L]
    return tf.reshape(logits, [shape[0], shape[1], -1])


def slot_logits(model, batch, training, aggregation: str) -> tf.Tensor:
    """The aggregated logits [B, L] of a batch of inputs in window slots ([B, K, S] inputs, window_mask [B, K])."""
    return aggregate_slots(window_slot_logits(model, batch, training), batch["window_mask"], aggregation)


def clean_negatives_loss(logits: tf.Tensor, window_mask: tf.Tensor, labels: tf.Tensor, weights: tf.Tensor,
                         aggregation: str = "max"):
    """--window_training=clean_negatives' loss (multiple-instance learning that trusts the inputs of the first
    label, "found nowhere"): logits float [B, K, L] of B inputs' window slots, window_mask int [B, K] (1: a
    window), labels int [B], weights float [B] (0: padding) -> (loss, accuracy of the aggregate, float scalars).

    An input of the first label: none of its windows holds the evidence, so each is that label; its loss is the
    mean cross-entropy of its windows against it. An input of another label: only some window holds it, unknown
    which; its loss is the cross-entropy of the `aggregation` (max, logmeanexp or any) of its windows, whose
    gradient goes to the windows that decide it. The weighted mean over inputs."""
    mask = tf.cast(window_mask, tf.float32)
    labels = tf.cast(labels, tf.int32)
    first = tf.zeros(tf.shape(mask), tf.int32)
    each_first = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=first, logits=logits)  # [B, K]
    negative = tf.reduce_sum(each_first * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)  # [B]
    aggregate = aggregate_slots(logits, window_mask, aggregation)  # [B, L]
    positive = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=aggregate)  # [B]
    weights = tf.cast(weights, tf.float32)
    denominator = tf.maximum(tf.reduce_sum(weights), 1.0)
    loss = tf.reduce_sum(weights * tf.where(labels == 0, negative, positive)) / denominator
    correct = tf.cast(tf.equal(tf.argmax(aggregate, -1, output_type=tf.int32), labels), tf.float32)
    return loss, tf.reduce_sum(weights * correct) / denominator


__all__ = ["EMPTY_SLOT_LOGIT", "aggregate_slots", "clean_negatives_loss", "slot_logits", "window_slot_logits"]
