"""Left-to-right language modelling: the paper's "LTR & No NSP" pretraining ablation (§5.1).

A causal `BertEncoder` (no position attends to a later one) predicts every next
token of `input_ids`: the hidden state at position i predicts token i + 1,
weighted by `input_mask` at i + 1 so padding is never a target. The output
layer is the masked-LM head (transform + LayerNorm + the tied word embeddings),
so the weights map to the original's `cls/predictions/*` names like an MLM
model's, and a fine-tuning run with the auxiliary LM loss starts from it.

The data are the ordinary pretraining TFRecords: the masked positions are put
back to their original tokens (`unmask_input_ids`), the masking itself and the
NSP labels are ignored, and segment ids are kept as they are.

Dimensions: B batch, S sequence, P predictions (S - 1 here), V vocab, H hidden.
"""

from __future__ import annotations

import keras
from keras import ops

from bert_tf.configs import BertConfig
from bert_tf.models.encoder import BertEncoder
from bert_tf.models.heads import MaskedLMHead
from bert_tf.models.pretrainer import masked_lm_loss_and_accuracy


def unmask_input_ids(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights):
    """The text before masking: input_ids int [B, S] with each real prediction's original id put back.

    masked_lm_positions / masked_lm_ids int [B, P], masked_lm_weights float [B, P]
    (0 on padded predictions, whose position 0 must not be overwritten).
    """
    seq_length = ops.shape(input_ids)[1]
    real = ops.cast(ops.greater(masked_lm_weights, 0), "int32")  # [B, P]
    where = ops.one_hot(ops.cast(masked_lm_positions, "int32"), seq_length, dtype="int32") * real[..., None]  # [B, P, S]
    replaced = ops.max(where, axis=1)  # [B, S]: 1 where a prediction was made
    original = ops.sum(where * ops.cast(masked_lm_ids, "int32")[..., None], axis=1)  # [B, S]
    input_ids = ops.cast(input_ids, "int32")
    return ops.where(ops.equal(replaced, 1), original, input_ids)


def next_token_targets(input_ids, input_mask):
    """-> (positions int [B, S-1], labels int [B, S-1], weights float32 [B, S-1]).

    Position i predicts token i + 1; the weight is input_mask at i + 1, so no
    padding is ever a label (and the last real token predicts nothing).
    """
    input_ids = ops.cast(input_ids, "int32")
    batch, seq_length = ops.shape(input_ids)[0], ops.shape(input_ids)[1]
    positions = ops.broadcast_to(ops.arange(seq_length - 1, dtype="int32")[None, :], (batch, seq_length - 1))
    return positions, input_ids[:, 1:], ops.cast(input_mask, "float32")[:, 1:]


def next_token_loss(encoder: BertEncoder, head: MaskedLMHead, inputs, training=False):
    """Causal LM on encoder inputs (input_ids, input_mask, segment_ids, int [B, S])
    -> (loss, accuracy, number of predictions), float32 scalars; loss averaged over real targets."""
    outputs = encoder(inputs, training=training)
    positions, labels, weights = next_token_targets(inputs["input_ids"], inputs["input_mask"])
    logits = head(outputs["sequence_output"], positions, encoder.word_embeddings)  # [B, S-1, V]
    loss, accuracy = masked_lm_loss_and_accuracy(logits, labels, weights)
    return loss, accuracy, ops.sum(weights)


@keras.saving.register_keras_serializable(package="bert_tf")
class LeftToRightPretrainer(keras.Model):
    """`LeftToRightPretrainer(config)(features, training=...)` -> dict of float32 scalars.

    `features`: the pretraining feature dict (input_ids, input_mask, segment_ids
    and, to undo the masking, masked_lm_positions / masked_lm_ids /
    masked_lm_weights; without them input_ids are used as they are). Returns
    "loss" = "lm_loss" (mean next-token cross-entropy over real targets),
    "lm_accuracy" and "num_predictions". `.encoder` is causal; `.masked_lm` is
    the LM output layer (named as BertPretrainer's, so checkpoints line up).
    """

    def __init__(self, config: BertConfig, encoder: BertEncoder | None = None,
                 name: str = "bert_ltr_pretrainer", **kwargs):
        super().__init__(name=name, **kwargs)
        self.config = config
        self.encoder = encoder if encoder is not None else BertEncoder(config, causal=True)
        if not self.encoder.causal:
            raise ValueError("LeftToRightPretrainer needs a causal encoder (BertEncoder(config, causal=True))")
        self.masked_lm = MaskedLMHead(
            config.vocab_size, config.hidden_size, config.hidden_act, config.initializer_range, name="masked_lm",
            layer_norm_eps=config.layer_norm_eps,
        )
        self.masked_lm.build()
        self.built = True  # variables exist: savable before a first call

    def call(self, features, training=False):
        input_ids = features["input_ids"]
        if "masked_lm_positions" in features:
            input_ids = unmask_input_ids(input_ids, features["masked_lm_positions"], features["masked_lm_ids"],
                                         features["masked_lm_weights"])
        inputs = {"input_ids": input_ids, "input_mask": features["input_mask"], "segment_ids": features["segment_ids"]}
        loss, accuracy, count = next_token_loss(self.encoder, self.masked_lm, inputs, training=training)
        return {"loss": loss, "lm_loss": loss, "lm_accuracy": accuracy, "num_predictions": count}

    def get_config(self):
        return {"config": self.config.to_dict(), "encoder": keras.saving.serialize_keras_object(self.encoder),
                "name": self.name}

    @classmethod
    def from_config(cls, config):
        encoder = config.get("encoder")
        return cls(BertConfig.from_dict(config["config"]), name=config.get("name", "bert_ltr_pretrainer"),
                   encoder=keras.saving.deserialize_keras_object(encoder) if encoder is not None else None)
