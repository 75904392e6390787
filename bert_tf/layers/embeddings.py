"""Word + segment + position embeddings, then LayerNorm and dropout (docs/reference.md §3).

Dimensions: B batch, S sequence length, H hidden size, V vocab size,
T token types (segments), P max positions.
"""

import keras
from keras import ops

from bert_tf.layers.dropout import Dropout
from bert_tf.layers.normalization import LayerNorm

# Original LayerNorm epsilon (Keras' default 1e-3 would break parity).
LAYER_NORM_EPSILON = 1e-12


class BertEmbeddings(keras.layers.Layer):
    """Embeds `input_ids` and `segment_ids` (int32 [B, S]) into [B, S, H].

    Sub-layer and weight names are stable; `bert_tf.checkpoints` maps them to
    the original `bert/embeddings/...` names.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        type_vocab_size: int,
        max_position_embeddings: int,
        dropout_rate: float,
        initializer_range: float,
        layer_norm_eps: float = LAYER_NORM_EPSILON,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.type_vocab_size = type_vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.dropout_rate = dropout_rate
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        init = keras.initializers.TruncatedNormal(stddev=initializer_range)
        self.word_embeddings = keras.layers.Embedding(
            vocab_size, hidden_size, embeddings_initializer=init, name="word_embeddings", dtype=self.dtype_policy
        )
        self.token_type_embeddings = keras.layers.Embedding(
            type_vocab_size,
            hidden_size,
            embeddings_initializer=init,
            name="token_type_embeddings",
            dtype=self.dtype_policy,
        )
        self.layer_norm = LayerNorm(
            epsilon=layer_norm_eps, name="LayerNorm", dtype=self.dtype_policy
        )
        self.dropout = Dropout(dropout_rate, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.word_embeddings.build((None, None))
        self.token_type_embeddings.build((None, None))
        # Positions 0..S-1 read the first S rows of one [P, H] table, as in the original.
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_position_embeddings, self.hidden_size),
            initializer=keras.initializers.TruncatedNormal(stddev=self.initializer_range),
        )
        self.layer_norm.build((None, None, self.hidden_size))

    def call(self, input_ids, segment_ids, training=False, word_table=None, position_ids=None):
        """input_ids, segment_ids: int32 [B, S] -> compute-dtype [B, S, H]. `word_table`:
        a [V, H] tensor to look words up in instead of the word_embeddings variable.
        `position_ids` int [B, S]: the rows of the position table to add (packed rows restart
        at each sequence, bert_tf/data/packing.py); None: 0..S-1 in every row."""
        seq_length = ops.shape(input_ids)[1]
        if word_table is None:
            words = self.word_embeddings(input_ids)  # [B, S, H]
        else:
            words = ops.take(word_table, input_ids, axis=0)
        segments = self.token_type_embeddings(segment_ids)  # [B, S, H]
        if position_ids is None:
            positions = self.position_embeddings[:seq_length][None, :, :]  # [1, S, H]
        else:
            positions = ops.take(self.position_embeddings, ops.cast(position_ids, "int32"), axis=0)  # [B, S, H]
        x = words + segments + ops.cast(positions, self.compute_dtype)
        x = self.layer_norm(x)  # computed in float32 by Keras, returned in compute dtype
        return self.dropout(x, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            type_vocab_size=self.type_vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            dropout_rate=self.dropout_rate,
            initializer_range=self.initializer_range,
            layer_norm_eps=self.layer_norm_eps,
        )
        return config
