"""Output heads on top of the encoder (docs/reference.md §3).

Every head is registered with Keras (package "bert_tf": `.keras` files name it
"bert_tf>ClassificationHead" etc.) and runs in float32 (its own dtype policy), whatever the encoder's
mixed-precision policy: logits and losses stay accurate, and the extra cost is
small because the heads see only [CLS], the masked positions, or one
projection per position.

Dimensions: B batch, S sequence, H hidden, V vocab, P masked positions per
sequence, L labels, C choices.
"""

from __future__ import annotations

from typing import Optional

import keras
import tensorflow as tf
from keras import ops

from bert_tf.layers.activations import get_activation
from bert_tf.layers.dropout import Dropout
from bert_tf.layers.embeddings import LAYER_NORM_EPSILON
from bert_tf.layers.normalization import LayerNorm

# Dropout on the pooled output before the classifier; the original hard-codes
# keep_prob=0.9 in run_classifier.py (docs/reference.md §3).
CLASSIFIER_DROPOUT = 0.1
HEAD_DTYPE = "float32"


@tf.custom_gradient
def _logits_of_table(x, table):
    """x [N, H], table [V, H] -> x @ table^T [N, V].

    The gradient of table is transpose(dy) @ x with the transpose made
    explicitly: as one MatMul(transpose_a) over the vocabulary it ran at 55%
    of the machine's matmul rate (58 vs 33 ms at BERT-base batch 8 on CPU).
    """

    def grad(dy):
        return tf.matmul(dy, table), tf.matmul(tf.transpose(dy), x)

    return tf.matmul(x, table, transpose_b=True), grad


def _truncated_normal(stddev):
    return keras.initializers.TruncatedNormal(stddev=stddev)


@keras.saving.register_keras_serializable(package="bert_tf")
class OutputProjection(keras.layers.Layer):
    """logits = x @ output_weights^T + output_bias, weights stored [units, H].

    The [out, in] layout is the original's for every head it names
    `output_weights` (NSP, classifier, SQuAD), so checkpoints map without transposes.
    """

    def __init__(self, units: int, hidden_size: int, initializer_range: float = 0.02, **kwargs):
        kwargs.setdefault("dtype", HEAD_DTYPE)
        super().__init__(**kwargs)
        self.units = units
        self.hidden_size = hidden_size
        self.initializer_range = initializer_range

    def build(self, input_shape=None):
        self.output_weights = self.add_weight(
            name="output_weights",
            shape=(self.units, self.hidden_size),
            initializer=_truncated_normal(self.initializer_range),
        )
        self.output_bias = self.add_weight(name="output_bias", shape=(self.units,), initializer="zeros")

    def call(self, x):
        """x: [..., H] -> float32 [..., units]."""
        x = ops.cast(x, self.compute_dtype)
        return ops.matmul(x, ops.transpose(self.output_weights)) + self.output_bias

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, hidden_size=self.hidden_size, initializer_range=self.initializer_range)
        return config


def gather_positions(sequence, positions):
    """sequence: [B, S, H], positions: int [B, P] -> [B, P, H] (hidden states at those positions)."""
    batch, seq_length, hidden = ops.shape(sequence)[0], ops.shape(sequence)[1], ops.shape(sequence)[2]
    positions = ops.cast(positions, "int32")
    offsets = ops.arange(batch, dtype="int32")[:, None] * seq_length  # [B, 1]
    flat_positions = ops.reshape(positions + offsets, (-1,))  # [B * P]
    flat_sequence = ops.reshape(sequence, (-1, hidden))  # [B * S, H]
    gathered = ops.take(flat_sequence, flat_positions, axis=0)  # [B * P, H]
    return ops.reshape(gathered, (batch, ops.shape(positions)[1], hidden))  # [B, P, H]


@keras.saving.register_keras_serializable(package="bert_tf")
class MaskedLMHead(keras.layers.Layer):
    """Masked-LM logits at the masked positions only.

    transform (dense H + hidden_act, LayerNorm), then multiply by the transposed
    word-embedding table (tied, passed at call time) and add `output_bias` [V].
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        hidden_act: str = "gelu",
        initializer_range: float = 0.02,
        name: str = "masked_lm",
        layer_norm_eps: float = LAYER_NORM_EPSILON,
        **kwargs,
    ):
        kwargs.setdefault("dtype", HEAD_DTYPE)
        super().__init__(name=name, **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.transform = keras.layers.Dense(
            hidden_size,
            activation=get_activation(hidden_act),
            kernel_initializer=_truncated_normal(initializer_range),
            name="transform",
            dtype=self.dtype_policy,
        )
        self.layer_norm = LayerNorm(
            epsilon=layer_norm_eps, name="transform_LayerNorm", dtype=self.dtype_policy
        )

    def build(self, input_shape=None):
        self.transform.build((None, self.hidden_size))
        self.layer_norm.build((None, self.hidden_size))
        self.output_bias = self.add_weight(name="output_bias", shape=(self.vocab_size,), initializer="zeros")

    def call(self, sequence_output, masked_lm_positions, embedding_table, transformed=False):
        """sequence_output [B, S, H], masked_lm_positions int [B, P], embedding_table [V, H]
        -> float32 logits [B, P, V]. With masked_lm_positions None, sequence_output
        is already the [B, P, H] hidden states at the masked positions; with transformed=True it is
        transform_states' output, and only vocab_logits runs.

        vocab_logits reads output_bias, so a caller outside this layer reaches it through here: a
        direct call inside a mixed-precision model's autocast scope would read the float32 bias as
        float16 and add it to float32 logits."""
        states = sequence_output if transformed else self.transform_states(sequence_output, masked_lm_positions)
        return self.vocab_logits(states, embedding_table)

    def transform_states(self, sequence_output, masked_lm_positions=None):
        """The head's first half: [B, S, H] (at masked_lm_positions [B, P], or all of them when None)
        -> transform + LayerNorm [B, P, H]."""
        x = ops.cast(sequence_output, self.compute_dtype)
        if masked_lm_positions is not None:
            x = gather_positions(x, masked_lm_positions)  # [B, P, H]
        return self.layer_norm(self.transform(x))

    def vocab_logits(self, x, embedding_table):
        """The head's second half: transformed states [B, P, H] -> float32 logits [B, P, V] against the
        tied table [V, H] plus output_bias (the vocabulary-wide part: most of the head's cost)."""
        table = ops.cast(embedding_table, self.compute_dtype)  # [V, H]
        shape = ops.shape(x)
        logits = _logits_of_table(ops.reshape(x, (-1, shape[-1])), table)  # [B * P, V]
        return ops.reshape(logits, (shape[0], shape[1], self.vocab_size)) + self.output_bias  # [B, P, V]

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            hidden_act=self.hidden_act,
            initializer_range=self.initializer_range,
            layer_norm_eps=self.layer_norm_eps,
        )
        return config


class _ProjectionHead(keras.layers.Layer):
    """What the heads below share: an OutputProjection to `units` (named as the original names its weights),
    after dropout when `dropout_rate` is given; hidden_size, initializer_range (and dropout_rate) in the config.
    Each head adds its own arguments to its config."""

    def __init__(self, units: int, hidden_size: int, initializer_range: float, projection_name: str,
                 dropout_rate: Optional[float] = None, **kwargs):
        kwargs.setdefault("dtype", HEAD_DTYPE)
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.initializer_range = initializer_range
        self.dropout_rate = dropout_rate
        if dropout_rate is not None:
            self.dropout = Dropout(dropout_rate, dtype=self.dtype_policy)
        self.projection = OutputProjection(units, hidden_size, initializer_range, name=projection_name)

    def build(self, input_shape=None):
        self.projection.build()

    def project(self, x, training=False):
        """x [..., H] -> float32 [..., units], dropout first when the head has it."""
        if self.dropout_rate is not None:
            x = self.dropout(ops.cast(x, self.compute_dtype), training=training)
        return self.projection(x)

    def get_config(self):
        config = super().get_config()
        config.update(hidden_size=self.hidden_size, initializer_range=self.initializer_range)
        if self.dropout_rate is not None:
            config.update(dropout_rate=self.dropout_rate)
        return config


@keras.saving.register_keras_serializable(package="bert_tf")
class NextSentenceHead(_ProjectionHead):
    """2-way classifier on the pooled output; label 0 = IsNext, 1 = random next."""

    def __init__(self, hidden_size: int, initializer_range: float = 0.02, name: str = "next_sentence", **kwargs):
        super().__init__(2, hidden_size, initializer_range, "seq_relationship", name=name, **kwargs)

    def call(self, pooled_output):
        """pooled_output [B, H] -> float32 logits [B, 2]."""
        return self.project(pooled_output)


@keras.saving.register_keras_serializable(package="bert_tf")
class ClassificationHead(_ProjectionHead):
    """Dropout on the pooled output, then a dense layer to `num_labels` (1 = regression)."""

    def __init__(
        self,
        num_labels: int,
        hidden_size: int,
        initializer_range: float = 0.02,
        dropout_rate: float = CLASSIFIER_DROPOUT,
        name: str = "classifier",
        **kwargs,
    ):
        super().__init__(num_labels, hidden_size, initializer_range, "output", dropout_rate, name=name, **kwargs)
        self.num_labels = num_labels

    def call(self, pooled_output, training=False):
        """pooled_output [B, H] -> float32 logits [B, L]."""
        return self.project(pooled_output, training=training)

    def get_config(self):
        return dict(super().get_config(), num_labels=self.num_labels)


@keras.saving.register_keras_serializable(package="bert_tf")
class SpanHead(_ProjectionHead):
    """A dense layer to 2 on every position: start and end logits (SQuAD)."""

    def __init__(self, hidden_size: int, initializer_range: float = 0.02, name: str = "span", **kwargs):
        super().__init__(2, hidden_size, initializer_range, "squad", name=name, **kwargs)

    def call(self, sequence_output):
        """sequence_output [B, S, H] -> (start_logits, end_logits), each float32 [B, S]."""
        logits = self.project(sequence_output)  # [B, S, 2]
        return logits[..., 0], logits[..., 1]


@keras.saving.register_keras_serializable(package="bert_tf")
class MultipleChoiceHead(_ProjectionHead):
    """One score per (context, choice) from its pooled output; softmax is over the choices."""

    def __init__(
        self,
        num_choices: int,
        hidden_size: int,
        initializer_range: float = 0.02,
        dropout_rate: float = CLASSIFIER_DROPOUT,
        name: str = "multiple_choice",
        **kwargs,
    ):
        super().__init__(1, hidden_size, initializer_range, "output", dropout_rate, name=name, **kwargs)
        self.num_choices = num_choices

    def call(self, pooled_output, training=False):
        """pooled_output [B * C, H] (choices of one example adjacent) -> float32 logits [B, C]."""
        scores = self.project(pooled_output, training=training)  # [B * C, 1]
        return ops.reshape(scores, (-1, self.num_choices))  # [B, C]

    def get_config(self):
        return dict(super().get_config(), num_choices=self.num_choices)


@keras.saving.register_keras_serializable(package="bert_tf")
class TokenTaggingHead(ClassificationHead):
    """Dropout then a dense layer to `num_labels` on every position (NER):
    sequence_output [B, S, H] -> float32 logits [B, S, L]. The classification head's
    layers applied per token (the projection works on any leading shape)."""

    def __init__(self, num_labels: int, hidden_size: int, initializer_range: float = 0.02,
                 dropout_rate: float = CLASSIFIER_DROPOUT, name: str = "tagger", **kwargs):
        super().__init__(num_labels, hidden_size, initializer_range, dropout_rate, name=name, **kwargs)
