"""Fine-tuning models: an already built `BertEncoder` plus one head (docs/reference.md §3).

Dimensions: B batch, S sequence, C choices, L labels. Inputs are the encoder's
dict (`input_ids`, `input_mask`, `segment_ids`, int32 [B, S]; [B, C, S] for
multiple choice). Logits are float32.
"""

from __future__ import annotations

import keras
from keras import ops

from bert_tf.models.encoder import INPUT_NAMES, BertEncoder
from bert_tf.models.heads import ClassificationHead, MultipleChoiceHead, SpanHead, TokenTaggingHead


def pooled_output(encoder: BertEncoder, inputs, training=False, skip_padding=False):
    """encoder(inputs)["pooled_output"], with the last block computed at [CLS] only (exact; a
    classifier reads nothing else) and, with skip_padding, dense layers on real tokens only.
    A causal encoder pools its last token and computes everything."""
    if encoder.causal:
        return encoder(inputs, training=training)["pooled_output"]
    no_positions = ops.zeros((ops.shape(inputs["input_ids"])[0], 0), "int32")
    return encoder(inputs, training=training, skip_padding=skip_padding,
                   output_positions=no_positions)["pooled_output"]


class _PooledModel(keras.Model):
    """A model that reads only the pooled output. `skip_padding` (default on) runs the dense layers
    on real tokens only: the same outputs, less work for padded batches; it needs dynamic shapes,
    so the Trainer turns it off for XLA-compiled training."""

    skip_padding = True


class BertClassifier(_PooledModel):
    """Sentence(-pair) classification; `num_labels=1` is regression (STS-B). -> logits [B, L]."""

    def __init__(self, encoder: BertEncoder, num_labels: int, name: str = "bert_classifier", **kwargs):
        super().__init__(name=name, **kwargs)
        self.encoder = encoder
        self.num_labels = num_labels
        self.head = ClassificationHead(num_labels, encoder.config.hidden_size, encoder.config.initializer_range)
        self.head.build()

    def call(self, inputs, training=False):
        pooled = pooled_output(self.encoder, inputs, training=training, skip_padding=self.skip_padding)
        return self.head(pooled, training=training)


class BertSpanLabeler(keras.Model):
    """Extractive QA (SQuAD). -> {"start_logits": [B, S], "end_logits": [B, S]}."""

    def __init__(self, encoder: BertEncoder, name: str = "bert_span_labeler", **kwargs):
        super().__init__(name=name, **kwargs)
        self.encoder = encoder
        self.head = SpanHead(encoder.config.hidden_size, encoder.config.initializer_range)
        self.head.build()

    def call(self, inputs, training=False):
        start, end = self.head(self.encoder(inputs, training=training)["sequence_output"])
        return {"start_logits": start, "end_logits": end}


class BertMultipleChoice(_PooledModel):
    """SWAG-style multiple choice: inputs int32 [B, C, S] -> logits [B, C] (softmax over C)."""

    def __init__(self, encoder: BertEncoder, num_choices: int, name: str = "bert_multiple_choice", **kwargs):
        super().__init__(name=name, **kwargs)
        self.encoder = encoder
        self.num_choices = num_choices
        self.head = MultipleChoiceHead(num_choices, encoder.config.hidden_size, encoder.config.initializer_range)
        self.head.build()

    def call(self, inputs, training=False):
        seq_length = ops.shape(inputs["input_ids"])[-1]
        # [B, C, S] -> [B * C, S]: every (context, choice) pair is encoded on its own.
        flat = {key: ops.reshape(inputs[key], (-1, seq_length)) for key in INPUT_NAMES}
        pooled = pooled_output(self.encoder, flat, training=training, skip_padding=self.skip_padding)  # [B * C, H]
        return self.head(pooled, training=training)


class BertTokenClassifier(keras.Model):
    """Token tagging (NER). -> logits [B, S, L]."""

    def __init__(self, encoder: BertEncoder, num_labels: int, name: str = "bert_token_classifier", **kwargs):
        super().__init__(name=name, **kwargs)
        self.encoder = encoder
        self.num_labels = num_labels
        self.head = TokenTaggingHead(num_labels, encoder.config.hidden_size, encoder.config.initializer_range)
        self.head.build()

    def call(self, inputs, training=False):
        return self.head(self.encoder(inputs, training=training)["sequence_output"], training=training)
