"""Inputs longer than one sequence: overlapping windows with a stride, and putting their outputs back together.

One home for the window rules every task shares (SQuAD, classification, tagging):
- `doc_spans_for`: (start, length) windows over n pieces, each `doc_stride` pieces after the
  previous one, the last reaching the end (the original run_squad.py's rule);
- `check_is_max_context`: of the windows holding a piece, the one that gives it the most
  context on its shorter side (SQuAD's max-context rule) owns it;
- `aggregate_windows`: per-window outputs [M, L] -> one output per input [N, L] by
  AGGREGATIONS ("mean", "max" or "first").

Plain numpy; no TensorFlow.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

# Weight of the span length in the max-context score: breaks ties between spans in favour of longer ones.
MAX_CONTEXT_LENGTH_WEIGHT = 0.01

LONG_INPUTS = ("truncate", "windows")
AGGREGATIONS = ("mean", "max", "first")


def doc_spans_for(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> List[tuple]:
    """(start, length) windows over `num_tokens` pieces: at most `max_tokens_for_doc` long, each
    starting `doc_stride` after the previous, the last one reaching the end."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def check_is_max_context(doc_spans, cur_span_index: int, position: int) -> bool:
    """Whether span `cur_span_index` gives piece `position` its most context: the score is
    min(left, right) + 0.01 * span length; the first span wins ties."""
    best_score, best_span_index = None, None
    for span_index, (start, length) in enumerate(doc_spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + MAX_CONTEXT_LENGTH_WEIGHT * length
        if best_score is None or score > best_score:
            best_score, best_span_index = score, span_index
    return cur_span_index == best_span_index


def check_window_settings(long_inputs: str, doc_stride: int, aggregation: str) -> None:
    """ValueError (one line, in flag names) for settings no run can use."""
    if long_inputs not in LONG_INPUTS:
        raise ValueError(f"--long_inputs must be one of {', '.join(LONG_INPUTS)}, got {long_inputs!r}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"--window_aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    if long_inputs == "windows" and doc_stride < 1:
        raise ValueError(f"--doc_stride must be positive, got {doc_stride}")


def aggregate_windows(outputs, window_example, num_examples: int, aggregation: str) -> np.ndarray:
    """Per-window outputs -> one output per input.

    outputs: float [M, L] (logits, or [M, 1] regression values) of M windows, in input order
    (every input's windows together, first window first); window_example: int [M], the input
    each window belongs to (every input 0..N-1 has at least one window).
    aggregation: "mean" (the mean of its windows' outputs), "max" (each output unit's largest
    value over its windows: a class wins when any window argues for it strongly) or "first"
    (its first window's, what truncation reads). Returns float [N, L].
    """
    outputs = np.asarray(outputs)
    window_example = np.asarray(window_example, np.int64)
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"window aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    if len(outputs) != len(window_example):
        raise ValueError(f"{len(outputs)} window outputs for {len(window_example)} windows")
    counts = np.bincount(window_example, minlength=num_examples)
    if len(counts) != num_examples or (counts == 0).any():
        raise ValueError(f"every one of the {num_examples} inputs needs at least one window")
    if aggregation == "first":
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        if not np.array_equal(window_example[starts], np.arange(num_examples)):
            raise ValueError("windows must come in input order, each input's windows together")
        return outputs[starts]
    if aggregation == "mean":
        total = np.zeros((num_examples,) + outputs.shape[1:], np.float64)
        np.add.at(total, window_example, outputs)
        return (total / counts.reshape((-1,) + (1,) * (outputs.ndim - 1))).astype(outputs.dtype)
    out = np.full((num_examples,) + outputs.shape[1:], -np.inf, outputs.dtype)
    np.maximum.at(out, window_example, outputs)
    return out


def window_weights(window_example: Sequence[int]) -> np.ndarray:
    """float32 [M]: 1 / (number of windows of its input) for each window, so every input weighs 1 in a loss."""
    window_example = np.asarray(window_example, np.int64)
    counts = np.bincount(window_example)
    return (1.0 / counts[window_example]).astype(np.float32)
