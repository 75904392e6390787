"""Fine-tuning tasks: read task files -> examples -> features; post-processing; metrics.

Modules (import the one you need; this package imports nothing heavy):
  glue           GLUE / XNLI / your own TSV-CSV classification and regression
  squad          SQuAD v1.1 / v2.0 reading, featurizing and answer post-processing
  squad_metrics  the official SQuAD v1.1 and v2.0 evaluation
  swag           SWAG multiple choice
  conll          CoNLL-2003 named-entity recognition and conlleval scoring

Everything here is plain Python / numpy, so the runners can wrap the features in
`tf.data` however they batch (fixed shapes on TPU, by length elsewhere); the one exception,
window_aggregation (the window aggregations, in TensorFlow), is loaded only where it is called.
Each task's `features_to_arrays` stacks its features with `padded_arrays` and adds its own fields.
"""

from typing import Dict, Mapping, Optional, Sequence

import numpy as np

from bert_tf.errors import InputDataError

TaskDataError = InputDataError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


# Label id of word pieces (and [CLS]/[SEP]/padding) that carry no label in token
# classification; the same convention as other BERT tooling, so masks are `label_ids != IGNORE_LABEL_ID`.
IGNORE_LABEL_ID = -100
# The token fields every task's features carry, one int per position.
INPUT_FIELDS = ("input_ids", "input_mask", "segment_ids")


def padded_arrays(features: Sequence, seq_length: Optional[int] = None, fields: Sequence[str] = INPUT_FIELDS,
                  fill: Optional[Mapping[str, int]] = None, choices: Optional[int] = None,
                  what: str = "a feature") -> Dict[str, np.ndarray]:
    """The features' token fields stacked into padded arrays: field -> int32 [N, S], or [N, C, S] with `choices`
    C (each feature holds C sequences per field, SWAG's endings).

    S is `seq_length`, or the longest sequence when None; each sequence is padded with fill[field] (default 0)
    after its own length. ValueError ("<what> has n tokens, more than seq_length S") when a sequence is longer.
    """
    fill = fill or {}
    rows = {k: [getattr(f, k) for f in features] for k in fields}
    if choices is not None:
        if any(len(r) != choices for k in fields for r in rows[k]):
            raise ValueError(f"every feature needs {choices} sequences per field")
        rows = {k: [seq for r in rows[k] for seq in r] for k in fields}  # [N * C] sequences
    longest = max((len(seq) for k in fields for seq in rows[k]), default=0)
    seq_length = longest if seq_length is None else seq_length
    if longest > seq_length:
        raise ValueError(f"{what} has {longest} tokens, more than seq_length {seq_length}")
    shape = (len(features),) if choices is None else (len(features), choices)
    out = {}
    for k in fields:
        grid = np.full((len(rows[k]), seq_length), fill.get(k, 0), np.int32)
        for i, seq in enumerate(rows[k]):
            grid[i, : len(seq)] = seq
        out[k] = grid.reshape(shape + (seq_length,))
    return out


def read_text(path: str) -> str:
    """The contents of a UTF-8 text file (local or gs://), a leading BOM dropped.

    Raises InputDataError naming the file, and the line of the first byte that is not UTF-8.
    """
    try:
        if "://" in str(path):
            import tensorflow as tf  # only remote paths (gs://...) need tf.io.gfile

            try:
                with tf.io.gfile.GFile(path, "rb") as f:
                    data = f.read()
            except tf.errors.OpError as e:
                raise OSError(e.message) from None
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        raise InputDataError(f"{path}: cannot read file ({e.strerror or e})") from None
    return decode_utf8(data, path)


def decode_utf8(data: bytes, path: str) -> str:
    """`data` decoded as UTF-8 without a leading BOM; a InputDataError names the first bad line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InputDataError(
            f"{path}:{line}: byte 0x{data[e.start]:02x} is not valid UTF-8 (expected a UTF-8 text file)"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text
