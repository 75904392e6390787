"""SWAG multiple choice: read the CSVs, build four `[CLS] context [SEP] choice [SEP]` sequences per example.

CSV columns (docs/reference.md §7): `,video-id,fold-ind,startphrase,sent1,sent2,gold-source,
ending0,ending1,ending2,ending3,label` (the test file has no label). The context is
`sent1`; choice k is `sent2 + " " + ending_k`; each pair is truncated like a GLUE pair.
Dimension letters: C = NUM_CHOICES, S = max_seq_length.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from bert_tf.errors import InputDataError
from bert_tf.tasks import padded_arrays, read_text
from bert_tf.tasks.glue import pair_to_ids, tokenize_all

NUM_CHOICES = 4
_REQUIRED = ("sent1", "sent2", "ending0", "ending1", "ending2", "ending3")


@dataclasses.dataclass(frozen=True)
class SwagExample:
    swag_id: str  # the file's first (unnamed) column
    context_sentence: str
    start_ending: str
    endings: tuple
    label: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class SwagFeatures:
    """input_ids, input_mask, segment_ids: C lists of ints (each unpadded unless asked)."""

    example_id: str
    input_ids: List[List[int]]
    input_mask: List[List[int]]
    segment_ids: List[List[int]]
    label_id: int


def read_swag_examples(input_file: str, has_labels: Optional[bool] = None) -> List[SwagExample]:
    """Reads a SWAG CSV. has_labels: None = labels if the header has a `label` column.

    Raises InputDataError (file:line) for missing columns, wrong column counts, labels outside 0..3.
    """
    reader = csv.reader(io.StringIO(read_text(input_file), newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise InputDataError(f"{input_file}: empty file (expected a SWAG header row)")
        missing = [c for c in _REQUIRED if c not in header]
        if missing:
            raise InputDataError(f"{input_file}:1: header has no column {missing[0]!r} (expected the SWAG columns "
                                f"{', '.join(_REQUIRED)}{', label' if has_labels else ''})")
        if has_labels is None:
            has_labels = "label" in header
        elif has_labels and "label" not in header:
            raise InputDataError(f"{input_file}:1: header has no column 'label'")
        col = {name: i for i, name in enumerate(header)}
        examples = []
        for fields in reader:
            line = reader.line_num
            if not fields:
                continue
            if len(fields) != len(header):
                raise InputDataError(f"{input_file}:{line}: expected {len(header)} comma-separated columns as in the "
                                    f"header, found {len(fields)}")
            label = None
            if has_labels:
                raw = fields[col["label"]].strip()
                if raw not in ("0", "1", "2", "3"):
                    raise InputDataError(f"{input_file}:{line}: expected a label 0..3, found {raw!r}")
                label = int(raw)
            examples.append(SwagExample(
                swag_id=fields[0],
                context_sentence=fields[col["sent1"]],
                start_ending=fields[col["sent2"]],
                endings=tuple(fields[col[f"ending{k}"]] for k in range(NUM_CHOICES)),
                label=label,
            ))
    except csv.Error as e:
        raise InputDataError(f"{input_file}:{reader.line_num}: malformed CSV row ({e})") from None
    return examples


def read_swag_split(data_dir: str, split: str) -> List[SwagExample]:
    """`train.csv`, `val.csv` (split "dev" or "val") or `test.csv` from data_dir."""
    name = {"train": "train.csv", "dev": "val.csv", "val": "val.csv", "test": "test.csv"}[split]
    return read_swag_examples(os.path.join(data_dir, name))


def convert_examples_to_features(
    examples: Sequence[SwagExample], max_seq_length: int, tokenizer, pad_to_max_length: bool = False
) -> List[SwagFeatures]:
    """Each example -> C sequences `[CLS] sent1 [SEP] sent2 ending_k [SEP]`, the pair truncated
    from the end of the longer side. label_id 0 for unlabeled (test) examples."""
    contexts = tokenize_all(tokenizer, [e.context_sentence for e in examples])
    choices = tokenize_all(tokenizer, [f"{e.start_ending} {ending}" for e in examples for ending in e.endings])
    features = []
    for i, example in enumerate(examples):
        ids, masks, segments = [], [], []
        for k in range(NUM_CHOICES):
            input_ids, segment_ids = pair_to_ids(tokenizer, list(contexts[i]), list(choices[i * NUM_CHOICES + k]),
                                                 max_seq_length)
            input_mask = [1] * len(input_ids)
            if pad_to_max_length:
                pad = max_seq_length - len(input_ids)
                input_ids, input_mask, segment_ids = (list(input_ids) + [0] * pad, input_mask + [0] * pad,
                                                      segment_ids + [0] * pad)
            ids.append(list(input_ids))
            masks.append(input_mask)
            segments.append(list(segment_ids))
        features.append(SwagFeatures(example.swag_id, ids, masks, segments, example.label or 0))
    return features


def features_to_arrays(features: Sequence[SwagFeatures], seq_length: Optional[int] = None) -> Dict[str, np.ndarray]:
    """input_ids, input_mask, segment_ids: int32 [N, C, S] zero-padded; label_ids: int32 [N]."""
    out = padded_arrays(features, seq_length, choices=NUM_CHOICES, what="a choice")
    out["label_ids"] = np.array([f.label_id for f in features], np.int32)
    return out


def predictions_text(examples: Sequence[SwagExample], probabilities) -> str:
    """A CSV of predictions: `id,ending0,ending1,ending2,ending3,prediction` (probabilities per
    ending, then the arg-max), one row per example."""
    probabilities = np.asarray(probabilities)
    if probabilities.shape != (len(examples), NUM_CHOICES):
        raise ValueError(f"expected probabilities [{len(examples)}, {NUM_CHOICES}], got {list(probabilities.shape)}")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id"] + [f"ending{k}" for k in range(NUM_CHOICES)] + ["prediction"])
    for example, row in zip(examples, probabilities, strict=True):
        writer.writerow([example.swag_id] + [repr(float(p)) for p in row] + [int(np.argmax(row))])
    return out.getvalue()
