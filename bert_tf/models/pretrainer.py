"""The pretraining model: encoder + masked-LM + next-sentence heads, with the original losses.

Losses and metrics follow docs/reference.md §3 (the original run_pretraining.py):
  masked_lm_loss   = sum(w * xent) / (sum(w) + 1e-5), w = masked_lm_weights
  next_sentence_loss = mean xent over the batch
  loss             = masked_lm_loss + next_sentence_loss
  masked_lm_accuracy = sum(w * [argmax == id]) / sum(w)
  next_sentence_accuracy = mean [argmax == label]

Packed rows (PACKED_PRETRAINING_FEATURES, bert_tf/data/packing.py: several
sequences per row) are recognised by their `sequence_ids` and handled in
_encode(): next-sentence is read at each sequence's `cls_positions` (the last
block there, then the pooler) and averaged over real sequences
(`next_sentence_weights`); masked-LM is averaged over the batch's masked tokens
as before, its vocabulary-wide logits computed for the real predictions only
(call(), _packed_masked_lm). The losses are the unpacked ones (tests/test_packing.py).

Dimensions: B batch, S sequence, P max predictions per sequence (per row when
packed), K sequences per packed row, V vocab.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from bert_tf.configs import BertConfig
from bert_tf.models.encoder import BertEncoder
from bert_tf.models.heads import MaskedLMHead, NextSentenceHead

# Keeps the MLM loss finite when a batch has no real predictions (the original's constant).
MLM_LOSS_DENOMINATOR_EPSILON = 1e-5

PRETRAINING_FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)
PACKED_PRETRAINING_FEATURES = (
    "input_ids",
    "segment_ids",
    "sequence_ids",
    "position_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "cls_positions",
    "next_sentence_labels",
    "next_sentence_weights",
)


def label_log_probs(logits, labels):
    """logits float32 [..., K], labels int [...] in [0, K) -> log p(label), float32 [...].

    One fused kernel that also computes the gradient (softmax - one_hot) in its forward pass;
    log_softmax + gather had the gather's gradient scatter into a zeroed [..., K] tensor.
    """
    return -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ops.cast(labels, "int32"),
                                                           logits=ops.cast(logits, "float32"))


def masked_lm_loss_and_accuracy(logits, masked_lm_ids, masked_lm_weights):
    """logits [B, P, V], ids int [B, P], weights float [B, P] -> (loss, accuracy), float32 scalars."""
    weights = ops.cast(masked_lm_weights, "float32")
    xent = -label_log_probs(logits, masked_lm_ids)  # [B, P]
    loss = ops.sum(weights * xent) / (ops.sum(weights) + MLM_LOSS_DENOMINATOR_EPSILON)
    correct = ops.cast(ops.equal(ops.argmax(logits, axis=-1), ops.cast(masked_lm_ids, "int64")), "float32")
    accuracy = ops.divide_no_nan(ops.sum(weights * correct), ops.sum(weights))
    return loss, accuracy


def next_sentence_loss_and_accuracy(logits, labels, weights=None):
    """logits [B, 2], labels int [B] or [B, 1] -> (mean xent, accuracy), float32 scalars.
    Packed: logits [B, K, 2], labels int [B, K], weights float [B, K] (1 per real sequence)
    -> the weighted means, i.e. the means over the real sequences (0 when there are none)."""
    logits = ops.reshape(logits, (-1, 2))  # [B * K, 2]
    labels = ops.reshape(ops.cast(labels, "int32"), (-1,))  # [B * K]
    xent = -label_log_probs(logits, labels)
    correct = ops.cast(ops.equal(ops.argmax(logits, axis=-1), ops.cast(labels, "int64")), "float32")
    if weights is None:
        return ops.mean(xent), ops.mean(correct)
    weights = ops.reshape(ops.cast(weights, "float32"), (-1,))
    count = ops.sum(weights)
    return ops.divide_no_nan(ops.sum(weights * xent), count), ops.divide_no_nan(ops.sum(weights * correct), count)


@tf.custom_gradient
def _tied(table):
    """(table, table) for the word lookup and the masked-LM output layer, whose gradient is the
    output layer's dense [V, H] gradient with the lookup's rows added into it in place
    (tensor_scatter_nd_add). Left to the tape, the two became one IndexedSlices of V + B*S rows
    (a 94 MB concatenation at BERT-base) that the optimizer then summed back into a new dense
    tensor: ~1.5% of a BERT-base step on CPU."""

    def grad(d_lookup, d_output):
        if d_output is None or d_lookup is None:
            return d_lookup if d_output is None else d_output
        if isinstance(d_lookup, tf.IndexedSlices):
            d_output = tf.convert_to_tensor(d_output)
            return tf.tensor_scatter_nd_add(d_output, d_lookup.indices[:, None], d_lookup.values)
        return tf.convert_to_tensor(d_output) + tf.convert_to_tensor(d_lookup)

    return (tf.identity(table), tf.identity(table)), grad


@keras.saving.register_keras_serializable(package="bert_tf")
class BertPretrainer(keras.Model):
    """`BertPretrainer(config)(features, training=...)` -> dict of float32 scalars.

    `features` is the original pretraining feature dict (PRETRAINING_FEATURES;
    `next_sentence_labels` is not needed without NSP). The result holds "loss",
    "masked_lm_loss", "masked_lm_accuracy" and, with next-sentence prediction,
    "next_sentence_loss" and "next_sentence_accuracy". `.encoder` is the
    `BertEncoder`; `.masked_lm` and `.next_sentence` are the heads.
    """

    def __init__(
        self,
        config: BertConfig,
        use_next_sentence_prediction: bool = True,
        encoder: BertEncoder | None = None,
        skip_padding: bool = True,
        name: str = "bert_pretrainer",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        self.config = config
        self.use_next_sentence_prediction = use_next_sentence_prediction
        # Dense layers on real tokens only (the same numbers): a shape that changes from batch to
        # batch, so XLA-compiled training builds the pretrainer with skip_padding=False.
        self.skip_padding = skip_padding
        self.encoder = encoder if encoder is not None else BertEncoder(config)
        self.masked_lm = MaskedLMHead(
            config.vocab_size, config.hidden_size, config.hidden_act, config.initializer_range, name="masked_lm",
            layer_norm_eps=config.layer_norm_eps,
        )
        self.masked_lm.build()
        if use_next_sentence_prediction:
            self.next_sentence = NextSentenceHead(config.hidden_size, config.initializer_range, name="next_sentence")
            self.next_sentence.build()
        else:
            self.next_sentence = None
        self.built = True  # variables exist: savable before a first call

    def logits(self, features, training=False):
        """-> {"masked_lm_logits": float32 [B, P, V], "next_sentence_logits": float32 [B, 2] (with NSP),
        for packed rows [B, K, 2], one per sequence}."""
        position_output, pooled, output_table = self._encode(features, training)
        result = {"masked_lm_logits": self.masked_lm(position_output, None, output_table)}
        if self.next_sentence is not None:
            result["next_sentence_logits"] = self.next_sentence(pooled)
        return result

    def _encode(self, features, training):
        """-> (the last block at masked_lm_positions [B, P, H], the pooler's output [B, H] (packed:
        [B, K, H] at cls_positions), the tied masked-LM output table [V, H])."""
        # The last block runs only at [CLS] and the masked positions: nothing else reaches a loss.
        lookup_table, output_table = _tied(ops.cast(self.encoder.word_embeddings, self.encoder.compute_dtype))
        positions = features["masked_lm_positions"]  # [B, P]
        packed = "sequence_ids" in features
        if packed:  # the last block also at every sequence's [CLS]: [B, K + P]
            num_cls = ops.shape(features["cls_positions"])[1]
            positions = ops.concatenate([ops.cast(features["cls_positions"], "int32"), ops.cast(positions, "int32")], 1)
        outputs = self.encoder.outputs_at(features, positions, training=training,
                                          skip_padding=self.skip_padding, word_table=lookup_table)
        position_output = outputs["position_output"]
        pooled = outputs["pooled_output"]  # [B, H]
        if packed:
            pooled = self.encoder.pooler(position_output[:, :num_cls])  # [B, K, H]
            position_output = position_output[:, num_cls:]  # [B, P, H]
        return position_output, pooled, output_table

    def _packed_masked_lm(self, position_output, output_table, features):
        """Packed rows' (masked_lm_loss, masked_lm_accuracy) from the last block at their Q prediction
        slots [B, Q, H], with the vocabulary-wide part of the head on the real predictions only.

        A packed row has room for Q = P + K predictions and fills about P of them (18.5 of 26 on the
        KJV records at seq 128): the head's [N, V] logits over every slot were 60% of packing's
        overhead there. The batch's real slots (weight != 0), moved to the front in order, fill
        C = B * (Q - K) slots (B * P with the packer's default Q); a batch with more real slots than
        that takes every slot. Dropped slots have weight 0, so the sums are the same terms."""
        ids, weights = features["masked_lm_ids"], ops.cast(features["masked_lm_weights"], "float32")
        batch, slots = weights.shape[0], weights.shape[1]
        capacity = None if batch is None or slots is None else batch * (slots - features["cls_positions"].shape[1])
        if capacity is None or not 0 < capacity < batch * slots:
            return masked_lm_loss_and_accuracy(self.masked_lm(position_output, None, output_table), ids, weights)
        hidden = ops.reshape(position_output, (1, batch * slots, ops.shape(position_output)[-1]))  # [1, B * Q, H]
        # The transform (H x H, a few % of the head) runs on every slot, outside the cond: its LayerNorm's
        # custom gradient keeps forward tensors that a cond branch cannot hand to the gradient in graph
        # mode ("Could not find external tensor capture"); only the [N, V] projection is in the branches.
        hidden = self.masked_lm.transform_states(hidden)  # [1, B * Q, H]
        ids, weights = ops.reshape(ids, (1, -1)), ops.reshape(weights, (1, -1))  # [1, B * Q]
        real = ops.cast(ops.not_equal(weights, 0.0), "int32")
        front = tf.argsort(1 - real, axis=-1, stable=True)[:, :capacity]  # [1, C]: real slots first, in order

        def compact():
            logits = self.masked_lm(tf.gather(hidden, front, batch_dims=1), None, output_table, transformed=True)  # [1, C, V]
            return masked_lm_loss_and_accuracy(logits, tf.gather(ids, front, batch_dims=1),
                                               tf.gather(weights, front, batch_dims=1))

        def every_slot():
            return masked_lm_loss_and_accuracy(self.masked_lm(hidden, None, output_table, transformed=True), ids, weights)

        return tf.cond(ops.sum(real) <= capacity, compact, every_slot)

    def call(self, features, training=False):
        position_output, pooled, output_table = self._encode(features, training)
        if "sequence_ids" in features:
            mlm_loss, mlm_accuracy = self._packed_masked_lm(position_output, output_table, features)
        else:
            mlm_loss, mlm_accuracy = masked_lm_loss_and_accuracy(
                self.masked_lm(position_output, None, output_table), features["masked_lm_ids"],
                features["masked_lm_weights"])
        result = {"loss": mlm_loss, "masked_lm_loss": mlm_loss, "masked_lm_accuracy": mlm_accuracy}
        if self.next_sentence is not None:
            nsp_loss, nsp_accuracy = next_sentence_loss_and_accuracy(
                self.next_sentence(pooled), features["next_sentence_labels"], features.get("next_sentence_weights")
            )
            result.update(loss=mlm_loss + nsp_loss, next_sentence_loss=nsp_loss, next_sentence_accuracy=nsp_accuracy)
        return result

    def get_config(self):
        return {
            "config": self.config.to_dict(),
            "use_next_sentence_prediction": self.use_next_sentence_prediction,
            "encoder": keras.saving.serialize_keras_object(self.encoder),
            "skip_padding": self.skip_padding,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        encoder = config.get("encoder")
        return cls(
            BertConfig.from_dict(config["config"]),
            use_next_sentence_prediction=config["use_next_sentence_prediction"],
            encoder=keras.saving.deserialize_keras_object(encoder) if encoder is not None else None,
            skip_padding=config.get("skip_padding", True),
            name=config.get("name", "bert_pretrainer"),
        )
