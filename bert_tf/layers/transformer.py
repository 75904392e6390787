"""One post-LayerNorm Transformer block (docs/reference.md §3).

    x = LN(x + dropout(attention(x)))
    x = LN(x + dropout(dense_H(act(dense_I(x)))))

`recomputed` is the same block for gradient checkpointing: its activations are not
kept for the backward pass, which runs the block again.

Dimensions: B batch, S sequence, H hidden, I intermediate size.
"""

import keras
import tensorflow as tf
from keras import ops

from bert_tf.layers.activations import Dense, get_activation
from bert_tf.layers.attention import SelfAttention
from bert_tf.layers.dropout import Dropout
from bert_tf.layers.embeddings import LAYER_NORM_EPSILON
from bert_tf.layers.layout import TokenLayout
from bert_tf.layers.normalization import LayerNorm


class TransformerBlock(keras.layers.Layer):
    """[B, S, H] -> [B, S, H]; sub-layer names are mapped to `bert/encoder/layer_i/...`."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        intermediate_size: int,
        hidden_act: str,
        hidden_dropout_rate: float,
        attention_dropout_rate: float,
        initializer_range: float,
        causal: bool = False,
        layer_norm_eps: float = LAYER_NORM_EPSILON,
        attention_implementation: str = "xla",
        plain_epilogues: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_rate = hidden_dropout_rate
        self.attention_dropout_rate = attention_dropout_rate
        self.initializer_range = initializer_range
        self.causal = causal
        self.layer_norm_eps = layer_norm_eps
        self.attention_implementation = attention_implementation
        # Training computes bias+GELU, dropout+add and LayerNorm as plain ops with TensorFlow's own gradients
        # instead of the fused custom-gradient kernels (a GPU candidate: XLA's cuBLASLt bias+GELU epilogue
        # and cuDNN LayerNorm match only plain patterns). The same function and variables.
        self.plain_epilogues = plain_epilogues
        init = keras.initializers.TruncatedNormal(stddev=initializer_range)
        policy = self.dtype_policy

        self.attention = SelfAttention(
            hidden_size, num_heads, attention_dropout_rate, initializer_range, causal=causal, name="attention",
            attention_implementation=attention_implementation, dtype=policy,
        )
        self.attention_dropout = Dropout(hidden_dropout_rate, dtype=policy)
        self.attention_layer_norm = LayerNorm(
            epsilon=layer_norm_eps, name="attention_LayerNorm", dtype=policy
        )
        self.intermediate = Dense(
            intermediate_size,
            activation=get_activation(hidden_act),
            kernel_initializer=init,
            name="intermediate",
            dtype=policy,
        )
        self.output_dense = keras.layers.Dense(hidden_size, kernel_initializer=init, name="output_dense", dtype=policy)
        self.output_dropout = Dropout(hidden_dropout_rate, dtype=policy)
        self.output_layer_norm = LayerNorm(
            epsilon=layer_norm_eps, name="output_LayerNorm", dtype=policy
        )

    def build(self, input_shape=None):
        hidden = (None, None, self.hidden_size)
        self.attention.build(hidden)
        self.attention_layer_norm.build(hidden)
        self.intermediate.build(hidden)
        self.output_dense.build((None, None, self.intermediate_size))
        self.output_layer_norm.build(hidden)

    def call(self, x, input_mask, training=False, layout=None, query_rows=None, dropout_seeds=None):
        """x: [B, S, H] compute dtype, or [T, H] token rows placed by `layout` (a TokenLayout);
        input_mask: int [B, S] (1 = real token).

        `query_rows` int [B, P] (rows of x) computes the block only for those
        tokens, attending over all of x, and returns [B * P, H]: what the
        encoder's last block needs when a head reads a few positions.
        `dropout_seeds`: draw_dropout_seeds' seeds for this call's masks (None: drawn here).
        """
        attention_seed, attention_output_seed, output_seed = dropout_seeds or (None, None, None)
        grid_input = layout is None
        if grid_input:
            layout = TokenLayout.dense(ops.shape(x)[0], ops.shape(x)[1])
            x = layout.to_rows(x)
        if query_rows is None:
            residual = x
            attended = self.attention(x, input_mask, training=training, layout=layout, dropout_seed=attention_seed)
        else:
            residual = ops.take(x, ops.reshape(query_rows, (-1,)), axis=0)  # [B * P, H]
            query_layout = TokenLayout.dense(ops.shape(query_rows)[0], ops.shape(query_rows)[1])
            attended = self.attention(
                x, input_mask, training=training, layout=layout, queries=residual, query_layout=query_layout,
                dropout_seed=attention_seed,
            )
        plain = self.plain_epilogues and training
        x = self.attention_layer_norm.add_and_norm(residual, attended, self.attention_dropout, training=training,
                                                   seed=attention_output_seed, plain=plain)
        y = self.output_dense(self.intermediate.plain_call(x) if plain else self.intermediate(x, training=training))
        out = self.output_layer_norm.add_and_norm(x, y, self.output_dropout, training=training, seed=output_seed,
                                                  plain=plain)
        return layout.to_grid(out) if grid_input and query_rows is None else out

    def draw_dropout_seeds(self, training):
        """The seeds (int [2] each, None where that dropout does nothing) of one call's three dropouts:
        the attention probabilities', the attention output's and the block output's."""
        dropouts = (self.attention.dropout, self.attention_dropout, self.output_dropout)
        return tuple(d.seed_generator.next() if d.fusable(training) else None for d in dropouts)

    def recomputed(self, x, input_mask, training=False, **kwargs):
        """self(x, input_mask, ...) with the same outputs and gradients, keeping none of the block's
        activations for the backward pass: it keeps x and runs the block again there (gradient
        checkpointing, Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"), a second
        forward pass for the memory of one block's activations at a time. The dropout seeds are drawn
        once, here, so the second pass drops the same elements (hashed masks are functions of the seed:
        bert_tf/layers/dropout.py); the mask, layout and query rows are not differentiated."""
        seeds = self.draw_dropout_seeds(training)

        def block(h):
            return self(h, input_mask, training=training, dropout_seeds=seeds, **kwargs)

        return tf.recompute_grad(block)(x)

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
            hidden_act=self.hidden_act,
            hidden_dropout_rate=self.hidden_dropout_rate,
            attention_dropout_rate=self.attention_dropout_rate,
            initializer_range=self.initializer_range,
            causal=self.causal,
            layer_norm_eps=self.layer_norm_eps,
            attention_implementation=self.attention_implementation,
            plain_epilogues=self.plain_epilogues,
        )
        return config
