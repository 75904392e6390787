"""Where the rows of a [T, C] token matrix sit in the [B, S] grid of a batch.

The Transformer blocks work on token rows: every dense layer, LayerNorm and
dropout sees a [T, C] matrix, and only attention needs the [B, S] grid. With
`TokenLayout.dense(B, S)` the rows are the whole grid in order (T = B * S);
with `TokenLayout.real_tokens(mask)` they are only the real tokens, so the
dense layers skip the padding (about 15% of the work on pretraining data) and
the results at real tokens are the same.

The real-token row count is rounded up to one of at most `ROW_BUCKETS` sizes
per batch shape. Every distinct row count is a new shape for the XLA kernels
(compiled per shape) and for oneDNN's matmul primitives (created per shape):
at BERT-base batch 8 a step with an unseen count took 0.37 s (15%) longer even
after warm-up, and real data gives a new count on most steps for a long time.
The spare rows copy a padded position, nothing reads them, and they get no
gradient.

Dimensions: B batch, S sequence, T rows, C channels.
"""

from __future__ import annotations

import tensorflow as tf
from keras import ops

ROW_BUCKETS = 64  # distinct real-token row counts per [B, S]; each wastes at most 1/64 of B * S rows


class TokenLayout:
    """Maps [T, C] rows to the [B, S, C] grid and back."""

    def __init__(self, batch, seq, index=None, inverse=None, owned=None):
        self.batch = batch
        self.seq = seq
        self.index = index  # int32 [T]: flat positions b * S + s of the rows, or None for all of them in order
        self.inverse = inverse  # int32 [B * S]: the row at each flat position, T (a zero row) where none
        self.owned = owned  # int32 [T]: index, but B * S at spare rows (copies of a position that has no row)
        self._head_index_cache = {}  # num_heads -> _head_indices (built once per layout)

    @classmethod
    def dense(cls, batch, seq):
        return cls(batch, seq)

    @classmethod
    def real_tokens(cls, input_mask, buckets=ROW_BUCKETS):
        """Rows for the positions where input_mask [B, S] is 1 and every sequence's first position
        ([CLS], read by the pooler, even in an all-padding row), plus spare rows at the first positions
        without one, up to the next multiple of ceil(B * S / buckets) rounded up to 8 (at most B * S);
        in row-major order. Static shapes apart from the row count, so XLA can compile it too."""
        batch, seq = ops.shape(input_mask)[0], ops.shape(input_mask)[1]
        first = ops.arange(seq, dtype="int32")[None, :] == 0
        flat = ops.reshape(ops.logical_or(ops.not_equal(input_mask, 0), first), (-1,))
        num_real = ops.sum(ops.cast(flat, "int32"))
        total = batch * seq
        step = ((total + buckets - 1) // buckets + 7) // 8 * 8
        num_rows = ops.minimum((num_real + step - 1) // step * step, total)
        spare = ops.logical_and(ops.logical_not(flat),
                                ops.cumsum(ops.cast(ops.logical_not(flat), "int32")) <= num_rows - num_real)
        selected = ops.logical_or(flat, spare)
        index = ops.cast(ops.reshape(ops.where(selected), (-1,)), "int32")
        rows_before = ops.cumsum(ops.cast(selected, "int32")) - 1  # row order = row-major order
        inverse = ops.where(flat, rows_before, num_rows)
        return cls(batch, seq, index, inverse, owned=ops.where(ops.take(flat, index, axis=0), index, total))

    def to_grid(self, rows):
        """[T, C] -> [B, S, C]; positions without a row are zero."""
        channels = ops.shape(rows)[-1]
        if self.index is not None:
            rows = _rows_to_grid(rows, self.owned, self.inverse)
        return ops.reshape(rows, (self.batch, self.seq, channels))

    def to_rows(self, grid):
        """[B, S, C] -> [T, C]."""
        rows = ops.reshape(grid, (self.batch * self.seq, ops.shape(grid)[-1]))
        return rows if self.index is None else _grid_to_rows(rows, self.index, self.inverse)

    def to_heads(self, rows, num_heads):
        """[T, N * D] rows -> [B, N, S, D], the layout attention's batched matmuls take.

        With real-token rows this is one gather that also does the head
        transpose. Positions without a row get an arbitrary real row's values
        rather than zeros: attention gives them exactly zero weight as keys
        (the mask bias makes their probabilities underflow to 0) and drops
        their outputs as queries, so every real position's result, and the
        gradient, is the same as with zero rows.
        """
        head_size = ops.shape(rows)[-1] // num_heads
        if self.index is None:
            grid = ops.reshape(rows, (self.batch, self.seq, num_heads, head_size))
            return ops.transpose(grid, (0, 2, 1, 3))
        grid_index, rows_index = self._head_indices(num_heads)
        flat = ops.reshape(rows, (-1, head_size))  # [T * N, D]
        return _rows_to_heads(flat, grid_index, rows_index)

    def from_heads(self, heads):
        """[B, N, S, D] -> [T, N * D] rows: the inverse of to_heads (values at positions without a row dropped)."""
        num_heads, head_size = ops.shape(heads)[1], ops.shape(heads)[3]
        if self.index is None:
            grid = ops.transpose(heads, (0, 2, 1, 3))
            return ops.reshape(grid, (self.batch * self.seq, num_heads * head_size))
        grid_index, rows_index = self._head_indices(num_heads)
        flat = ops.reshape(heads, (-1, head_size))  # [B * N * S, D]
        real = ops.reshape(ops.cast(self.inverse < ops.shape(self.index)[0], heads.dtype), (self.batch, 1, self.seq, 1))
        rows = _heads_to_rows(flat, grid_index, rows_index, real)  # [T * N, D]
        return ops.reshape(rows, (-1, num_heads * head_size))

    def _head_indices(self, num_heads):
        """int32 [B, N, S]: the [T * N, D] row of each (b, n, s), any real one where s has no row;
        int32 [T, N]: the [B * N * S, D] row of each (t, n). Built once per layout and head count."""
        cache = self._head_index_cache
        if num_heads not in cache:
            heads = ops.arange(num_heads, dtype="int32")
            rows = ops.where(self.inverse < ops.shape(self.index)[0], self.inverse, 0)  # [B * S]
            rows = ops.reshape(rows, (self.batch, 1, self.seq))
            grid_index = rows * num_heads + heads[None, :, None]
            b, s = self.index // self.seq, self.index % self.seq  # [T]
            rows_index = ((b[:, None] * num_heads + heads[None, :]) * self.seq) + s[:, None]
            cache[num_heads] = (grid_index, rows_index)
        return cache[num_heads]

    def rows_of(self, positions):
        """positions int [B, P] -> int32 [B * P]: the row holding each (b, positions[b, p]).

        A position with no row (padding) maps to row 0 (a [CLS]); callers give
        such positions zero weight, as the original's padded predictions.
        """
        positions = ops.cast(positions, "int32")
        flat = ops.reshape(positions + ops.arange(self.batch, dtype="int32")[:, None] * self.seq, (-1,))
        if self.index is None:
            return flat
        rows = ops.take(self.inverse, flat, axis=0)
        return ops.where(rows < ops.shape(self.index)[0], rows, 0)


# Both directions are gathers (multi-threaded copies), and each is the other's gradient: the real
# rows and the grid positions that have a row correspond one to one, and nothing reads a spare row,
# so spare rows get no gradient. TensorFlow's own ScatterNd (and the gradient of a gather, a segment
# sum) made skipping padding cost 13% at BERT-base when a batch had none.
def _padded(rows):
    return ops.concatenate([rows, ops.zeros((1, ops.shape(rows)[-1]), rows.dtype)], axis=0)


@tf.custom_gradient
def _rows_to_grid(rows, owned, inverse):
    """rows [T, C] -> flat grid [B * S, C]; `owned` [T] is each row's flat position, B * S for spare rows."""

    def grad(d_grid):
        return tf.gather(_padded(d_grid), owned), None, None

    return tf.gather(_padded(rows), inverse), grad


@tf.custom_gradient
def _grid_to_rows(grid, index, inverse):
    """flat grid [B * S, C] -> rows [T, C]."""

    def grad(d_rows):
        return tf.gather(_padded(d_rows), inverse), None, None

    return tf.gather(grid, index), grad


# The head layout's two gathers: real (b, n, s) and (t, n) correspond one to one, so each
# direction's gradient is the other gather; positions without a row get no gradient. A spare row's
# (t, n) copies a padded position, whose head-layout gradient is exactly zero (padded keys get zero
# attention weight, padded queries no gradient), so it gets none either.
@tf.custom_gradient
def _rows_to_heads(flat_rows, grid_index, rows_index):
    """[T * N, D] -> [B, N, S, D]."""

    def grad(d_heads):
        d_flat = tf.reshape(d_heads, (-1, tf.shape(d_heads)[-1]))
        return tf.reshape(tf.gather(d_flat, rows_index), (-1, tf.shape(d_heads)[-1])), None, None

    return tf.gather(flat_rows, grid_index), grad


@tf.custom_gradient
def _heads_to_rows(flat_heads, grid_index, rows_index, real):
    """[B * N * S, D] -> [T * N, D]; `real` [B, 1, S, 1] is 1 where s has a row."""

    def grad(d_rows):
        d_heads = tf.gather(d_rows, grid_index) * real  # [B, N, S, D]
        return tf.reshape(d_heads, (-1, tf.shape(d_rows)[-1])), None, None, None

    return tf.reshape(tf.gather(flat_heads, rows_index), (-1, tf.shape(flat_heads)[-1])), grad
