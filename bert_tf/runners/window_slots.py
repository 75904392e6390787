"""Inputs whose windows sit side by side in slots (bert_tf.tasks.windows.windows_in_slots): their logits, their
aggregate (classifier --window_training=aggregate's loss is taken on it), and --window_training=clean_negatives'
loss.

Dimensions: B inputs, K window slots, S max_seq_length, L labels.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.tasks.window_aggregation import aggregate_slots


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


__all__ = ["clean_negatives_loss", "slot_logits", "window_slot_logits"]
