"""Fine-tuning models: an already built `BertEncoder` plus one head (docs/reference.md §3).

Dimensions: B batch, S sequence, C choices, L labels, K sequences per packed row.
Inputs are the encoder's dict (`input_ids`, `input_mask`, `segment_ids`, int32
[B, S]; [B, C, S] for multiple choice). Logits are float32.

Packed rows (several examples per row, bert_tf.data.packing.pack_examples) are
the encoder's packed inputs (`sequence_ids`, `position_ids` instead of
`input_mask`) plus `cls_positions` int32 [B, K]: the classifier and multiple
choice then score every example of a row at its own [CLS] ([B, K, L], [B, K, C]);
the tagger needs nothing more (its logits are per token). Each example's logits
are its unpacked ones.

Every model saves as Keras does (`model.save("x.keras")`, `keras.models.load_model`):
its config nests its encoder's (`keras.saving.serialize_keras_object`) and the
weights follow. `bert_tf.pretrained.from_pretrained(BertClassifier, path, ...)` builds one on the
encoder of an original, Hugging Face or bert_tf checkpoint.
"""

from __future__ import annotations

import keras
from keras import ops

from bert_tf.models.encoder import INPUT_NAMES, PACKED_INPUT_NAMES, BertEncoder
from bert_tf.models.heads import ClassificationHead, MultipleChoiceHead, SpanHead, TokenTaggingHead


class _EncoderModel:
    """get_config / from_config of a model built as cls(encoder, **fields): the config holds
    the encoder's serialized config, the model's name and its `_CONFIG_FIELDS`. A mixin placed before
    keras.Model in the bases (Keras' own get_config of a subclassed model cannot serialize an encoder)."""

    _CONFIG_FIELDS: tuple = ()

    def get_config(self):
        config = {"encoder": keras.saving.serialize_keras_object(self.encoder), "name": self.name}
        config.update({field: getattr(self, field) for field in self._CONFIG_FIELDS})
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        encoder = keras.saving.deserialize_keras_object(config.pop("encoder"))
        return cls(encoder, **config)



# How a pooled model reads an input: "cls", the pooler at [CLS] (BERT's), or "mean", the last block averaged
# over the input's real tokens (what sentence-transformers checkpoints such as all-MiniLM-L6-v2 are trained for).
POOLINGS = ("cls", "mean")


class _PooledModel(keras.Model):
    """A model that reads only the pooled output: its encoder computes the last block at [CLS] only
    and, with `skip_padding` (the default), the dense layers on real tokens only (BertEncoder.pooled_output;
    the same numbers). Skipping padding gives a shape that changes from batch to batch: XLA-compiled
    training builds its model with skip_padding=False. pooling="mean" reads BertEncoder.mean_output instead."""

    def __init__(self, encoder: BertEncoder, skip_padding: bool = True, pooling: str = "cls", **kwargs):
        super().__init__(**kwargs)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.encoder = encoder
        self.skip_padding = skip_padding
        self.pooling = pooling

    def pooled_output(self, inputs, training=False):
        """[B, S] inputs -> [B, H]; packed rows (with cls_positions [B, K]) -> [B, K, H], each example's own."""
        if self.pooling == "mean":
            slots = inputs["cls_positions"].shape[1] if "cls_positions" in inputs else None
            return self.encoder.mean_output(inputs, training=training, skip_padding=self.skip_padding, slots=slots)
        if "cls_positions" not in inputs:
            return self.encoder.pooled_output(inputs, training=training, skip_padding=self.skip_padding)
        outputs = self.encoder.outputs_at(inputs, inputs["cls_positions"], training=training,
                                          skip_padding=self.skip_padding)
        return self.encoder.pooler(outputs["position_output"])  # [B, K, H]


@keras.saving.register_keras_serializable(package="bert_tf")
class BertClassifier(_EncoderModel, _PooledModel):
    """Sentence(-pair) classification; `num_labels=1` is regression (STS-B). -> logits [B, L].
    pooling: POOLINGS, what the head reads ("cls": the pooler at [CLS]; "mean": the tokens' mean)."""

    _CONFIG_FIELDS = ("num_labels", "skip_padding", "pooling")

    def __init__(self, encoder: BertEncoder, num_labels: int, name: str = "bert_classifier",
                 skip_padding: bool = True, pooling: str = "cls", **kwargs):
        super().__init__(encoder, skip_padding, pooling, name=name, **kwargs)
        self.num_labels = num_labels
        self.head = ClassificationHead(num_labels, encoder.config.hidden_size, encoder.config.initializer_range)
        self.head.build()
        self.built = True  # every variable exists: no call is needed before saving

    def call(self, inputs, training=False):
        pooled = self.pooled_output(inputs, training=training)  # [B, H] or packed [B, K, H]
        if len(pooled.shape) == 2:
            return self.head(pooled, training=training)
        rows, slots = ops.shape(pooled)[0], ops.shape(pooled)[1]
        logits = self.head(ops.reshape(pooled, (rows * slots, -1)), training=training)  # [B * K, L]
        return ops.reshape(logits, (rows, slots, self.num_labels))


@keras.saving.register_keras_serializable(package="bert_tf")
class BertSpanLabeler(_EncoderModel, keras.Model):
    """Extractive QA (SQuAD). -> {"start_logits": [B, S], "end_logits": [B, S]}."""

    def __init__(self, encoder: BertEncoder, name: str = "bert_span_labeler", **kwargs):
        super().__init__(name=name, **kwargs)
        self.encoder = encoder
        self.head = SpanHead(encoder.config.hidden_size, encoder.config.initializer_range)
        self.head.build()
        self.built = True  # every variable exists: no call is needed before saving

    def call(self, inputs, training=False):
        start, end = self.head(self.encoder(inputs, training=training)["sequence_output"])
        return {"start_logits": start, "end_logits": end}


@keras.saving.register_keras_serializable(package="bert_tf")
class BertMultipleChoice(_EncoderModel, _PooledModel):
    """SWAG-style multiple choice: inputs int32 [B, C, S] -> logits [B, C] (softmax over C)."""

    _CONFIG_FIELDS = ("num_choices", "skip_padding")

    def __init__(self, encoder: BertEncoder, num_choices: int, name: str = "bert_multiple_choice",
                 skip_padding: bool = True, **kwargs):
        super().__init__(encoder, skip_padding, name=name, **kwargs)
        self.num_choices = num_choices
        self.head = MultipleChoiceHead(num_choices, encoder.config.hidden_size, encoder.config.initializer_range)
        self.head.build()
        self.built = True  # every variable exists: no call is needed before saving

    def call(self, inputs, training=False):
        seq_length = ops.shape(inputs["input_ids"])[-1]
        packed = "cls_positions" in inputs
        # [B, C, S] -> [B * C, S]: every (context, choice) pair is encoded on its own.
        flat = {key: ops.reshape(inputs[key], (-1, seq_length))
                for key in (PACKED_INPUT_NAMES if packed else INPUT_NAMES)}
        if not packed:
            return self.head(self.pooled_output(flat, training=training), training=training)  # [B, C]
        # Packed: the C rows of a group hold the same examples at the same [CLS] positions.
        slots = ops.shape(inputs["cls_positions"])[-1]
        flat["cls_positions"] = ops.repeat(inputs["cls_positions"], self.num_choices, axis=0)  # [B * C, K]
        pooled = self.pooled_output(flat, training=training)  # [B * C, K, H]
        pooled = ops.transpose(ops.reshape(pooled, (-1, self.num_choices, slots, ops.shape(pooled)[-1])),
                               (0, 2, 1, 3))  # [B, K, C, H]: choices of one example adjacent
        logits = self.head(ops.reshape(pooled, (-1, ops.shape(pooled)[-1])), training=training)  # [B * K, C]
        return ops.reshape(logits, (-1, slots, self.num_choices))


@keras.saving.register_keras_serializable(package="bert_tf")
class BertTokenClassifier(_EncoderModel, keras.Model):
    """Token tagging (NER). -> logits [B, S, L]."""

    _CONFIG_FIELDS = ("num_labels",)

    def __init__(self, encoder: BertEncoder, num_labels: int, name: str = "bert_token_classifier", **kwargs):
        super().__init__(name=name, **kwargs)
        self.encoder = encoder
        self.num_labels = num_labels
        self.head = TokenTaggingHead(num_labels, encoder.config.hidden_size, encoder.config.initializer_range)
        self.head.build()
        self.built = True  # every variable exists: no call is needed before saving

    def call(self, inputs, training=False):
        return self.head(self.encoder(inputs, training=training)["sequence_output"], training=training)
