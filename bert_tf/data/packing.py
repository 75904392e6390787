"""Packing pretraining instances: several sequences share one row of max_seq_length (docs/design.md).

Records in the original schema (docs/reference.md §6) hold one instance per
row, zero-padded to max_seq_length: on the KJV records a third of the tokens at
seq 512 are padding, and under XLA (static shapes, every position computed)
padding costs what a real token costs. Packing puts several instances one after
another into a row, and the model keeps them apart (bert_tf/models/encoder.py,
pretrainer.py): attention only within a sequence, positions restarting at each
[CLS], next-sentence read at each sequence's own [CLS]. The losses are the
unpacked ones (tests/test_packing.py compares losses and gradients).

It runs in the input pipeline on the records users already have: a buffer of
parsed instances goes through `pack_features` (numpy) and comes out as packed
rows of static shapes.

A packed row (zero where unused):
  input_ids            int32 [S]  the sequences' tokens one after another, then padding
  segment_ids          int32 [S]  each sequence's own token types
  sequence_ids         int32 [S]  k for the tokens of the row's k-th sequence (1..K), 0 for padding;
                                  replaces input_mask: a token attends to its own sequence only
  position_ids         int32 [S]  0, 1, ... restarting at each sequence's [CLS]
  masked_lm_positions  int32 [Q]  the sequences' predictions in row order, shifted into the row
  masked_lm_ids        int32 [Q]
  masked_lm_weights    float32 [Q]  1.0 real, 0.0 padding
  cls_positions        int32 [K]  each sequence's [CLS] index in the row
  next_sentence_labels int32 [K]
  next_sentence_weights float32 [K]  1.0 for a sequence, 0.0 for an empty slot

Dimensions: N instances (one buffer), R packed rows, S max_seq_length,
P max_predictions_per_seq, Q max_predictions_per_row, K max_sequences_per_row,
B batch (rows).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from bert_tf.data import masking, pipelines

# At most this many sequences share a row. Each costs one [CLS] query and one prediction slot
# in the last block (2 of 512 positions of one of L blocks) and one next-sentence slot, so the
# bound is set by what it buys. KJV records at seq 512, buffer 2048 (tests/test_packing.py, docs/design.md):
# 96.8% efficiency with 3 per row, 98.2% with 4, 99.3% with 6, 99.6% with 8. At seq 128 any K >= 2
# gives 97.5%: the 93% of instances longer than 64 tokens cannot share a row (at most 97.9%).
# Graphcore's packed BERT stops at 3 on Wikipedia, which has fewer short documents than KJV.
MAX_SEQUENCES_PER_ROW = 6
# Instances packed together. Best-fit decreasing over a buffer leaves its worst rows at the
# buffer's end; a larger buffer shares that loss among more rows but holds more in memory
# (at seq 512, 2048 instances are 12 MB of int32 tokens). KJV at seq 512, 6 per row: 98.9% with
# 256, 99.2% with 1024, 99.3% with 2048; at seq 128: 97.0%, 97.4%, 97.5%.
PACKING_BUFFER_SIZE = 2048

PACKED_FEATURES = {  # name -> (dtype, length: "S", "Q" or "K")
    "input_ids": ("int32", "S"),
    "segment_ids": ("int32", "S"),
    "sequence_ids": ("int32", "S"),
    "position_ids": ("int32", "S"),
    "masked_lm_positions": ("int32", "Q"),
    "masked_lm_ids": ("int32", "Q"),
    "masked_lm_weights": ("float32", "Q"),
    "cls_positions": ("int32", "K"),
    "next_sentence_labels": ("int32", "K"),
    "next_sentence_weights": ("float32", "K"),
}
ORIGINAL_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                     "masked_lm_weights", "next_sentence_labels")


def default_max_predictions_per_row(max_predictions_per_seq: int, max_sequences_per_row: int) -> int:
    """Q = P + K: room for every row of records made by create_pretraining_data.

    An instance of n tokens has max(1, round(n * masked_lm_prob)) <= n * masked_lm_prob + 1
    predictions (capped at P), and the tool requires P >= round(S * masked_lm_prob)
    (docs/reference.md §6), so k sequences of at most S tokens in all have at most
    S * masked_lm_prob + k <= P + 1/2 + k predictions. Q is also a packing constraint, so
    other records still pack correctly, into a few more rows. P * K would be room for any
    records but multiplies the masked-LM head's positions by K.
    """
    return max_predictions_per_seq + max_sequences_per_row


def best_fit_decreasing(lengths, predictions, max_seq_length: int,
                        max_sequences_per_row: int = MAX_SEQUENCES_PER_ROW,
                        max_predictions_per_row: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """lengths, predictions int [N] -> (row int32 [N], slot int32 [N]): instance i goes to row[i]
    as its slot[i]-th sequence (rows 0..R-1, slots 0..K-1 in the order they fill a row).

    Longest instance first, each into the open row with the least free space that still
    takes it (tokens, predictions, sequence count), else into a new row. Why best-fit
    decreasing: it works on one buffer at a time, so it streams in tf.data and needs no
    pass over the data set first (Graphcore's histogram packing reaches ~99% but plans on
    the whole length histogram); the long instances that cannot share a row come first and
    the short ones fill the gaps, which leaves 0.7% padding on the KJV records at seq 512.
    Rows are numbered in the order they open. Deterministic: ties keep input order.
    """
    lengths = np.asarray(lengths, np.int64)
    predictions = np.asarray(predictions, np.int64)
    if max_predictions_per_row is None:
        max_predictions_per_row = np.inf
    if len(lengths) and (lengths.min() < 1 or lengths.max() > max_seq_length):
        raise ValueError(f"instance lengths must be in [1, {max_seq_length}], got {lengths.min()}..{lengths.max()}")
    if len(predictions) and predictions.max() > max_predictions_per_row:
        raise ValueError(f"an instance has {predictions.max()} predictions, more than max_predictions_per_row "
                         f"{max_predictions_per_row}")
    free_tokens, free_predictions, counts = [], [], []  # per row
    open_rows = [[] for _ in range(max_seq_length + 1)]  # free tokens -> open rows with that much room
    has_open = np.zeros(max_seq_length + 1, bool)
    row = np.empty(len(lengths), np.int32)
    slot = np.empty(len(lengths), np.int32)
    for i in np.argsort(-lengths, kind="stable"):
        n, p = lengths[i], predictions[i]
        target = None
        for room in np.flatnonzero(has_open[n:]) + n:  # the tightest room first
            candidates = open_rows[room]
            fits = [j for j, r in enumerate(candidates) if free_predictions[r] >= p]
            if fits:
                target = candidates.pop(fits[0])
                has_open[room] = bool(candidates)
                break
        if target is None:
            target = len(counts)
            free_tokens.append(max_seq_length)
            free_predictions.append(max_predictions_per_row)
            counts.append(0)
        row[i], slot[i] = target, counts[target]
        counts[target] += 1
        free_tokens[target] -= n
        free_predictions[target] -= p
        if counts[target] < max_sequences_per_row and free_tokens[target] > 0:
            open_rows[free_tokens[target]].append(target)
            has_open[free_tokens[target]] = True
    return row, slot


def _offsets_in_row(row, slot, sizes):
    """row, slot, sizes int [N] -> int [N]: the sum of the sizes of the earlier slots of each row."""
    order = np.lexsort((slot, row))  # by row, then slot
    ends = np.cumsum(sizes[order])
    starts = ends - sizes[order]
    first = np.ones(len(order), bool)
    first[1:] = row[order][1:] != row[order][:-1]
    row_base = np.maximum.accumulate(np.where(first, starts, 0))  # starts only grow
    out = np.empty(len(order), np.int64)
    out[order] = starts - row_base
    return out


def _prefix_counts(flags, name):
    """flags bool [N, L] that must be a prefix of ones per row -> counts int [N]."""
    counts = flags.sum(1)
    if not np.array_equal(flags, np.arange(flags.shape[1])[None, :] < counts[:, None]):
        raise ValueError(f"{name}: real entries must come first in every instance (the original schema)")
    return counts


def pack_features(features: Dict[str, np.ndarray], max_sequences_per_row: int = MAX_SEQUENCES_PER_ROW,
                  max_predictions_per_row: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Original features (ORIGINAL_FEATURES, [N, S] / [N, P] / [N, 1]) -> packed rows [R, S] / [R, Q] / [R, K].

    Every instance lands in exactly one row (best_fit_decreasing), its tokens in order at an
    offset o, with position_ids 0..n-1, its predictions' positions + o, its [CLS] at
    cls_positions = o. Q defaults to default_max_predictions_per_row(P, K).
    """
    ids = np.asarray(features["input_ids"])
    num, seq = ids.shape
    pred = np.asarray(features["masked_lm_positions"]).shape[1]
    if max_predictions_per_row is None:
        max_predictions_per_row = default_max_predictions_per_row(pred, max_sequences_per_row)
    real = _prefix_counts(np.asarray(features["input_mask"]) != 0, "input_mask")
    weights = np.asarray(features["masked_lm_weights"], np.float32)
    real_predictions = _prefix_counts(weights != 0, "masked_lm_weights")
    row, slot = best_fit_decreasing(real, real_predictions, seq, max_sequences_per_row, max_predictions_per_row)
    rows = int(row.max()) + 1 if num else 0
    token_offset = _offsets_in_row(row, slot, real)
    prediction_offset = _offsets_in_row(row, slot, real_predictions)

    width = {"S": seq, "Q": max_predictions_per_row, "K": max_sequences_per_row}
    out = {name: np.zeros((rows, width[size]), dtype) for name, (dtype, size) in PACKED_FEATURES.items()}
    inst, t = np.nonzero(np.arange(seq)[None, :] < real[:, None])  # every real token, in order
    at = (row[inst], token_offset[inst] + t)
    out["input_ids"][at] = ids[inst, t]
    out["segment_ids"][at] = np.asarray(features["segment_ids"])[inst, t]
    out["sequence_ids"][at] = slot[inst] + 1
    out["position_ids"][at] = t
    inst, j = np.nonzero(weights != 0)  # every real prediction, in order
    at = (row[inst], prediction_offset[inst] + j)
    out["masked_lm_positions"][at] = np.asarray(features["masked_lm_positions"])[inst, j] + token_offset[inst]
    out["masked_lm_ids"][at] = np.asarray(features["masked_lm_ids"])[inst, j]
    out["masked_lm_weights"][at] = weights[inst, j]
    out["cls_positions"][row, slot] = token_offset
    out["next_sentence_labels"][row, slot] = np.asarray(features["next_sentence_labels"]).reshape(num)
    out["next_sentence_weights"][row, slot] = 1.0
    return out


def packing_efficiency(token_ids) -> float:
    """Real tokens / all tokens of an int [.., S] input_mask or sequence_ids (nonzero = real)."""
    token_ids = np.asarray(token_ids)
    return float(np.count_nonzero(token_ids)) / max(token_ids.size, 1)


# ------------------------------------------------------------------ tf.data
def pack_dataset(batches, batch_size: int, max_sequences_per_row: int = MAX_SEQUENCES_PER_ROW,
                 max_predictions_per_row: Optional[int] = None, shuffle_rows: int = 0,
                 seed: Optional[int] = None, drop_remainder: bool = True):
    """A Dataset of original-feature batches ([N, S] dicts, e.g. pipelines.pretraining_dataset with
    batch_size=PACKING_BUFFER_SIZE) -> a Dataset of packed batches [B, S] / [B, Q] / [B, K].

    Each input batch is one packing buffer. `shuffle_rows` > 0 shuffles the packed rows through
    a buffer of that many (a buffer's rows come out longest-first). Without `drop_remainder`
    the last batch is filled up with empty rows (all weights 0: they change no loss or metric),
    so the shapes stay static and no instance is dropped.
    """
    import tensorflow as tf

    spec = batches.element_spec
    seq = spec["input_ids"].shape[-1]
    if max_predictions_per_row is None:
        max_predictions_per_row = default_max_predictions_per_row(spec["masked_lm_positions"].shape[-1],
                                                                  max_sequences_per_row)
    width = {"S": seq, "Q": max_predictions_per_row, "K": max_sequences_per_row}
    names = tuple(PACKED_FEATURES)
    dtypes = [tf.as_dtype(PACKED_FEATURES[n][0]) for n in names]

    def pack(*arrays):
        packed = pack_features(dict(zip(ORIGINAL_FEATURES, arrays, strict=True)), max_sequences_per_row,
                               max_predictions_per_row)
        return [packed[n] for n in names]

    def pack_batch(features):
        packed = tf.numpy_function(pack, [features[n] for n in ORIGINAL_FEATURES], dtypes, stateful=False)
        for tensor, name in zip(packed, names, strict=True):
            tensor.set_shape([None, width[PACKED_FEATURES[name][1]]])
        return dict(zip(names, packed, strict=True))

    rows = batches.map(pack_batch, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    if shuffle_rows:
        rows = rows.shuffle(shuffle_rows, seed=seed)
    if not drop_remainder and batch_size > 1:
        empty = {n: tf.zeros([width[PACKED_FEATURES[n][1]]], d) for n, d in zip(names, dtypes, strict=True)}
        rows = rows.concatenate(tf.data.Dataset.from_tensors(empty).repeat(batch_size - 1))
    return rows.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def packed_pretraining_dataset(files, max_seq_length: int, max_predictions_per_seq: int, batch_size: int,
                               is_training: bool, input_context=None, seed: Optional[int] = None,
                               max_sequences_per_row: int = MAX_SEQUENCES_PER_ROW,
                               max_predictions_per_row: Optional[int] = None,
                               buffer_size: int = PACKING_BUFFER_SIZE, skip_corrupt_records: bool = False,
                               dynamic_masking=None, mask_seed: int = masking.EVAL_MASK_SEED):
    """pipelines.pretraining_dataset, packed: batches of `batch_size` packed rows (static shapes).

    Reads, shards and shuffles the original records as pipelines.pretraining_dataset does,
    packs them `buffer_size` at a time, and (training) shuffles the packed rows. Evaluation
    reads every record once and keeps every instance (the last batch filled with empty rows).
    Records without masks (`dynamic_masking`, `mask_seed`: as pipelines.pretraining_dataset) get
    theirs per buffer, before packing.
    """
    buffers = pipelines.pretraining_dataset(
        files, max_seq_length, max_predictions_per_seq, buffer_size, is_training, input_context=input_context,
        seed=seed, skip_corrupt_records=skip_corrupt_records, drop_remainder=is_training,
        dynamic_masking=dynamic_masking, mask_seed=mask_seed)
    return pack_dataset(buffers, batch_size, max_sequences_per_row, max_predictions_per_row,
                        shuffle_rows=buffer_size if is_training else 0, seed=seed, drop_remainder=is_training)


# ------------------------------------------------------------------ fine-tuning examples
# Fine-tuning rows are short (GLUE at seq 128: most of a row is padding), so more of them share a
# row than pretraining instances do. A sequence costs one [CLS] query in the last block, one slot
# of the head and one label slot; K is part of the batch shape, so it is one constant for every
# split (one compiled program). 16 holds CoLA's median sentence (about 11 wordpieces) 11 to a row.
FINETUNE_MAX_SEQUENCES_PER_ROW = 16


class PackedExamples:
    """Fine-tuning examples packed into rows, and where each example went (to put predictions back).

    arrays   the model's inputs and the labels, packed (pack_examples)
    row, slot, offset, length  int [N]: example i is slot[i] of row[i], its tokens at
             offset[i] .. offset[i] + length[i] - 1 of the row (of each of its choice rows)
    """

    def __init__(self, arrays, row, slot, offset, length):
        self.arrays = arrays
        self.row, self.slot, self.offset, self.length = row, slot, offset, length

    @property
    def num_rows(self) -> int:
        return len(self.arrays["input_ids"])

    def efficiency(self) -> float:
        """Real tokens / all token slots of the packed rows."""
        return packing_efficiency(self.arrays["sequence_ids"])

    def unpack(self, outputs, sequence_outputs: bool = False, fill: float = -1e4):
        """The model's outputs on the packed rows -> one output per example, in input order.

        Pooled outputs [R, K, ...] (a classifier's logits [R, K, L], multiple choice [R, K, C]) ->
        [N, ...]. Per-token outputs [R, S, ...] (tagging) -> [N, S, ...], each example's tokens
        moved back to the front and `fill` after them (never an argmax).
        """
        outputs = np.asarray(outputs)
        if not sequence_outputs:
            return outputs[self.row, self.slot]
        seq = outputs.shape[1]
        out = np.full((len(self.row),) + outputs.shape[1:], fill, outputs.dtype)
        inst, t = np.nonzero(np.arange(seq)[None, :] < self.length[:, None])
        out[inst, t] = outputs[self.row[inst], self.offset[inst] + t]
        return out


def pack_examples(arrays: Dict[str, np.ndarray], max_sequences_per_row: int = FINETUNE_MAX_SEQUENCES_PER_ROW,
                  pad_values: Optional[Dict[str, int]] = None) -> PackedExamples:
    """Featurized fine-tuning arrays -> PackedExamples (best_fit_decreasing on example lengths).

    arrays: input_ids, input_mask, segment_ids int [N, S] (or [N, C, S] for multiple choice:
    the C choices of an example are C rows encoded alike); per-token arrays of the same shape
    (tagging's label_ids) and per-example arrays [N, ...] (label_ids, is_real_example).
    Packed: input_ids, segment_ids, sequence_ids, position_ids and the per-token arrays
    [R, (C,) S]; cls_positions int32 [R, K]; the per-example arrays [R, K, ...] and
    is_real_example int32 [R, K] (0 in empty slots: weight 0 in every loss and metric).
    An example of multiple choice takes the same slot and offset in all C rows of its group,
    as long as its longest choice. Per-token arrays are filled with pad_values[name] (default 0)
    where no token is.
    """
    ids = np.asarray(arrays["input_ids"])
    grouped = ids.ndim == 3
    mask = np.asarray(arrays["input_mask"]) != 0
    num, seq = ids.shape[0], ids.shape[-1]
    if not grouped:
        ids, mask = ids[:, None, :], mask[:, None, :]
    choices = ids.shape[1]
    real = _prefix_counts(mask.reshape(-1, seq), "input_mask").reshape(num, choices)  # [N, C]
    length = np.maximum(real.max(1), 1)  # [N]: an all-padding example still takes its [CLS]
    row, slot = best_fit_decreasing(length, np.zeros(num, np.int64), seq, max_sequences_per_row)
    offset = _offsets_in_row(row, slot, length)
    rows = int(row.max()) + 1 if num else 0
    inst, c, t = np.nonzero(np.arange(seq)[None, None, :] < real[:, :, None])  # every real token
    at = (row[inst], c, offset[inst] + t)
    pad_values = pad_values or {}
    out = {}

    def tokens(name, values, fill):
        grid = np.full((rows, choices, seq), fill, values.dtype)
        grid[at] = values.reshape(num, choices, seq)[inst, c, t]
        out[name] = grid if grouped else grid[:, 0]

    tokens("input_ids", ids, 0)
    tokens("segment_ids", np.asarray(arrays["segment_ids"]), 0)
    tokens("sequence_ids", np.broadcast_to((slot + 1).astype(np.int32)[:, None, None], ids.shape), 0)
    tokens("position_ids", np.broadcast_to(np.arange(seq, dtype=np.int32), ids.shape), 0)
    out["cls_positions"] = np.zeros((rows, max_sequences_per_row), np.int32)
    out["cls_positions"][row, slot] = offset
    real_example = np.asarray(arrays.get("is_real_example", np.ones(num, np.int32)), np.int32)
    out["is_real_example"] = np.zeros((rows, max_sequences_per_row), np.int32)
    out["is_real_example"][row, slot] = real_example
    for name, values in arrays.items():
        values = np.asarray(values)
        if name in out or name == "input_mask":
            continue
        if values.shape == np.asarray(arrays["input_ids"]).shape:  # per token
            tokens(name, values, pad_values.get(name, 0))
        else:  # per example
            grid = np.zeros((rows, max_sequences_per_row) + values.shape[1:], values.dtype)
            grid[row, slot] = values
            out[name] = grid
    return PackedExamples(out, row.astype(np.int64), slot.astype(np.int64), offset, length)
