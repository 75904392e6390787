"""Multi-head self-attention as in the original (docs/reference.md §3).

Dimensions: B batch, F "from" positions, T "to" positions (F = T = S for
self-attention), N heads, D head size (H / N), H hidden size.
"""

import math
import zlib

import keras
import tensorflow as tf
from keras import ops

from bert_tf.layers import fused_attention
from bert_tf.layers.dropout import Dropout, apply_keep_mask, seed_words
from bert_tf.layers.layout import TokenLayout

# Added to the scores of masked positions before the softmax (the original's value).
MASKED_SCORE_BIAS = -10000.0
# How training computes softmax(q k^T) v: "xla", TensorFlow's ops (what XLA fuses under jit_compile, the
# default); "cudnn", cuDNN's fused flash attention under XLA on an NVIDIA GPU (layers/fused_attention.py), on
# q/k/v with their heads transposed apart ([B, N, S, D]); "cudnn_btnh", the same on the projections merely
# reshaped ([B, S, N, D]: no head transposes before the calls, a GPU candidate).
ATTENTION_IMPLEMENTATIONS = ("xla", "cudnn", "cudnn_btnh")
_CUDNN_LAYOUTS = {"cudnn": "BNTH", "cudnn_btnh": "BTNH"}


def attention_bias_from_mask(input_mask):
    """input_mask: int [B, T] (1 = real token) -> float32 additive bias [B, 1, 1, T];
    int [B, F, T] (1 where query f may attend key t, packed_attention_mask) -> [B, 1, F, T]."""
    bias = (1.0 - ops.cast(input_mask, "float32")) * MASKED_SCORE_BIAS
    return bias[:, None, None, :] if len(input_mask.shape) == 2 else bias[:, None, :, :]


def packed_attention_mask(sequence_ids):
    """sequence_ids int [B, S] (k for the k-th sequence of a packed row, 0 padding) -> int32 [B, S, S]:
    1 where query i may attend key j, i.e. sequence_ids[i] == sequence_ids[j] != 0 (block-diagonal).

    Every key of another sequence gets MASKED_SCORE_BIAS, whose softmax weight underflows to
    exactly 0 in float32 as a padded key's does, so each sequence's attention is the unpacked
    one (bert_tf/data/packing.py). A padded query has no key; its output is never read.
    """
    ids = ops.cast(sequence_ids, "int32")
    same = ops.logical_and(ops.equal(ids[:, :, None], ids[:, None, :]), ops.not_equal(ids, 0)[:, None, :])
    return ops.cast(same, "int32")


def causal_attention_bias(seq_length):
    """-> float32 [1, 1, F, T] with MASKED_SCORE_BIAS where t > f: no position attends to a later one.

    The left-to-right (GPT-style) mask of the paper's "LTR & No NSP" ablation (§5.1).
    """
    positions = ops.arange(seq_length)
    future = ops.cast(positions[None, :] > positions[:, None], "float32")  # [F, T], 1 above the diagonal
    return (future * MASKED_SCORE_BIAS)[None, None, :, :]


@tf.function(jit_compile=True, autograph=False)
def _dropped_softmax_forward(scores, bias, scale, seed, rate):
    probs = tf.nn.softmax(tf.cast(scores, tf.float32) * scale + bias, axis=-1)
    return tf.cast(apply_keep_mask(probs, seed, rate), scores.dtype), probs


@tf.function(jit_compile=True, autograph=False)
def _dropped_softmax_grad(probs, d_dropped, scale, seed, rate, dtype):
    d_probs = apply_keep_mask(tf.cast(d_dropped, tf.float32), seed, rate)
    d_logits = probs * (d_probs - tf.reduce_sum(d_probs * probs, axis=-1, keepdims=True))
    return tf.cast(d_logits * scale, dtype)


def dropped_softmax(scores, bias, scale: float, seed, rate: float):
    """hashed_dropout(softmax(scores * scale + bias), seed, rate) in the dtype of scores, the
    softmax in float32; forward and backward one XLA kernel each (training only: the scaling,
    bias, softmax, dropout and their gradients were ten ops over the [B, N, F, T] scores)."""
    seed = seed_words(seed)

    @tf.custom_gradient
    def forward(scores):
        dropped, probs = _dropped_softmax_forward(scores, bias, scale, seed, rate)
        return dropped, lambda d: _dropped_softmax_grad(probs, d, scale, seed, rate, scores.dtype)

    return forward(scores)


class SelfAttention(keras.layers.Layer):
    """Separate Q/K/V dense layers with bias, scaled dot product, output dense.

    The softmax runs in float32 under mixed precision: scores are cast up, the
    mask bias added, normalised, and the probabilities cast back down.

    attention_implementation="cudnn" computes training calls with cuDNN's fused
    attention (fused_attention.py: a jit-compiled step on an NVIDIA GPU, bfloat16
    or float16, unpacked rows whose real tokens come first, not causal; attention
    dropout is cuDNN's, with a seed fixed per layer); inference calls keep the
    ops of "xla" (the same function), so models build, evaluate and export anywhere.
    "cudnn_btnh" is "cudnn" with q/k/v as [B, S, N, D] (fused_attention's BTNH).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout_rate: float,
        initializer_range: float,
        causal: bool = False,
        attention_implementation: str = "xla",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if attention_implementation not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attention_implementation must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, "
                             f"got {attention_implementation!r}")
        if attention_implementation in _CUDNN_LAYOUTS and causal:
            raise ValueError("cudnn attention takes a padding mask only; a causal encoder needs the xla one")
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.dropout_rate = dropout_rate
        self.initializer_range = initializer_range
        self.causal = causal  # left-to-right: position f attends to t <= f only
        self.attention_implementation = attention_implementation

        def dense(name):
            return keras.layers.Dense(
                hidden_size,
                kernel_initializer=keras.initializers.TruncatedNormal(stddev=initializer_range),
                bias_initializer="zeros",
                name=name,
                dtype=self.dtype_policy,
            )

        self.query = dense("query")
        self.key = dense("key")
        self.value = dense("value")
        self.output_dense = dense("output_dense")
        self.dropout = Dropout(dropout_rate, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        for layer in (self.query, self.key, self.value, self.output_dense):
            layer.build((None, None, self.hidden_size))

    def call(self, x, input_mask, training=False, layout=None, queries=None, query_layout=None, dropout_seed=None):
        """Self-attention of the tokens x over themselves (before the residual).

        x: [B, S, H], or [T, H] token rows placed by `layout` (a TokenLayout);
        input_mask: int [B, S] (1 = real token). `queries` [Q, H] with
        `query_layout` attend instead of x's own rows (keys and values still
        come from x): the encoder's last block computes only the positions a
        head reads. Returns the layout of the queries: [B, S, H] for grid x,
        rows otherwise.

        The mask, not a float bias, is passed in: Keras would cast a float
        argument to bfloat16 under a mixed policy. `dropout_seed` int [2]: the
        attention dropout's seed, drawn by the caller (a block recomputed in the
        backward pass must drop the same probabilities twice); None draws one.
        """
        grid_input = layout is None
        if grid_input:
            layout = TokenLayout.dense(ops.shape(x)[0], ops.shape(x)[1])
            x = layout.to_rows(x)
        if queries is None:
            queries, query_layout = x, layout
        elif self.causal:
            raise ValueError("causal attention computes every position; it takes no separate queries")
        cudnn_layout = _CUDNN_LAYOUTS.get(self.attention_implementation) if training else None
        if cudnn_layout == "BTNH":  # the projections' rows as [B, S, N, D]: a reshape on the dense layout
            q = self._btnh(query_layout, self.query(queries))  # [B, F, N, D]
            k = self._btnh(layout, self.key(x))  # [B, T, N, D]
            v = self._btnh(layout, self.value(x))  # [B, T, N, D]
            context = self._cudnn_context(q, k, v, input_mask, queries is not x, cudnn_layout)  # [B, F, N, D]
            batch, length = ops.shape(context)[0], ops.shape(context)[1]
            context_rows = query_layout.to_rows(ops.reshape(context, (batch, length, self.hidden_size)))  # [Q, H]
        else:
            q = query_layout.to_heads(self.query(queries), self.num_heads)  # [B, N, F, D]
            k = layout.to_heads(self.key(x), self.num_heads)  # [B, N, T, D]
            v = layout.to_heads(self.value(x), self.num_heads)  # [B, N, T, D]
            if cudnn_layout:
                context = self._cudnn_context(q, k, v, input_mask, queries is not x, cudnn_layout)  # [B, N, F, D]
            else:
                context = self._context(q, k, v, input_mask, layout, training, dropout_seed)  # [B, N, F, D]
            context_rows = query_layout.from_heads(context)  # [Q, H]
        out = self.output_dense(context_rows)  # query rows [Q, H]
        return query_layout.to_grid(out) if grid_input else out

    def _context(self, q, k, v, input_mask, layout, training, dropout_seed=None):
        """softmax(q k^T / sqrt(D) + mask bias) v in TensorFlow's ops: [B, N, F, D]."""
        scores = tf.matmul(q, k, transpose_b=True)  # [B, N, F, T]
        scale = 1.0 / math.sqrt(self.head_size)
        bias = attention_bias_from_mask(input_mask)  # [B, 1, 1, T]
        if self.causal:
            bias = bias + causal_attention_bias(layout.seq)  # [B, 1, F, T]
        if self.dropout.fusable(training):
            seed = dropout_seed if dropout_seed is not None else self.dropout.seed_generator.next()
            probs = dropped_softmax(scores, bias, scale, seed, float(self.dropout.rate))
        else:
            # tf.nn.softmax, the op ops.softmax runs, without its warning for one key (T = 1: a model built
            # on a one-token batch, as the Trainer finds its metric names; one key is a valid attention).
            probs = tf.nn.softmax(ops.cast(scores, "float32") * scale + bias, axis=-1)  # [B, N, F, T], float32
            probs = self.dropout(ops.cast(probs, self.compute_dtype), training=training)
        return ops.matmul(probs, v)  # [B, N, F, D]

    def _btnh(self, layout, rows):
        """[T, N * D] rows -> [B, S, N, D] (the grid, then the heads split off the channels)."""
        grid = layout.to_grid(rows)  # [B, S, H]
        return ops.reshape(grid, (ops.shape(grid)[0], ops.shape(grid)[1], self.num_heads, self.head_size))

    def _cudnn_context(self, q, k, v, input_mask, separate_queries: bool, layout: str):
        """The same through cuDNN's fused attention: [B, N, F, D] (layout "BNTH") or [B, F, N, D]
        ("BTNH"). Each row's keys are its first sum(input_mask) positions (at least one: the XLA path
        gives a row without keys uniform weights); its queries the same ones, or all F when the
        queries are apart (the last block's)."""
        if len(input_mask.shape) != 2:
            raise ValueError("cudnn attention takes an input_mask [B, S]; packed rows need the xla attention")
        key_lengths = ops.maximum(ops.sum(ops.cast(input_mask, "int32"), axis=1), 1)  # [B]
        query_count = ops.shape(q)[fused_attention.SEQUENCE_AXIS[layout]]
        query_lengths = ops.full_like(key_lengths, query_count) if separate_queries else key_lengths
        rate = float(self.dropout.rate) if self.dropout.fusable(True) else 0.0
        # A fixed seed per layer (cuDNN's mask is an attribute of the compiled call, not a tensor).
        seed = zlib.crc32(self.path.encode()) % 2**31
        return fused_attention.fused_attention(q, k, v, query_lengths, key_lengths, 1.0 / math.sqrt(self.head_size),
                                               dropout_rate=rate, seed=seed, layout=layout)

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            dropout_rate=self.dropout_rate,
            initializer_range=self.initializer_range,
            causal=self.causal,
            attention_implementation=self.attention_implementation,
        )
        return config
