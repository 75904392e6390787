"""Inputs longer than one sequence: overlapping windows with a stride, and putting their outputs back together.

One home for the window rules every task shares (SQuAD, classification, tagging):
- `doc_spans_for`: (start, length) windows over n pieces, each `doc_stride` pieces after the
  previous one, the last reaching the end (the original run_squad.py's rule);
- `check_is_max_context`: of the windows holding a piece, the one that gives it the most
  context on its shorter side (SQuAD's max-context rule) owns it;
- `aggregate_windows`: per-window outputs [M, L] -> one output per input [N, L] by
  AGGREGATIONS ("mean", "max", "logmeanexp", "any" or "first"), as training and the export compute them
  (bert_tf.tasks.window_aggregation: one definition, in TensorFlow);
- `windows_in_slots`: the windows of each input side by side in a fixed number of slots, for training
  on the aggregate (WINDOW_TRAINING "aggregate": the loss is taken on each input's aggregated output);
- `select_windows`: the windows a round of top-k selection trains on, each with its own label.

Plain numpy; no TensorFlow on import (the flag checks read this module): aggregate_windows loads it when called.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

# Weight of the span length in the max-context score: breaks ties between spans in favour of longer ones.
MAX_CONTEXT_LENGTH_WEIGHT = 0.01

LONG_INPUTS = ("truncate", "windows")
# The window aggregations (what each computes: bert_tf.tasks.window_aggregation, in TensorFlow).
AGGREGATIONS = ("mean", "max", "logmeanexp", "any", "first")
# How a model on windows trains: "each" window alone with its input's label (weighted 1 / windows of its
# input), or on the "aggregate" of its input's windows (multiple-instance learning: the loss is taken on the
# aggregated output, so the gradient reaches the windows that decide it), or in two stages (one run;
# bert_tf.runners.classifier.run_in_two_stages): each window for --num_train_epochs, then from that model
# "each_then_aggregate" the aggregate for EACH_THEN_AGGREGATE_SHARE of that, or "each_then_calibrate" the first
# label's logit shifted and every logit scaled to fit the training inputs' aggregate (first_label_calibration);
# or "clean_negatives", multiple-instance learning that takes every window of an input of the first label ("found
# nowhere") as that label and another input's label as its windows' aggregate (max, logmeanexp or any:
# FOUND_SOMEWHERE), then calibrated as each_then_calibrate.
WINDOW_TRAINING = ("each", "aggregate", "each_then_aggregate", "each_then_calibrate", "clean_negatives")
# The window trainings whose first label means "found nowhere" (no regression), and the aggregations that read so.
FIRST_LABEL_TRAINING, FOUND_SOMEWHERE = ("each_then_calibrate", "clean_negatives"), ("max", "logmeanexp", "any")
# each_then_aggregate: the aggregate stage's epochs as a share of the each-window stage's. On the needle task
# (docs/finetuning.md) a quarter epoch of the aggregate set the each-window model's threshold.
EACH_THEN_AGGREGATE_SHARE = 0.25
# "each_then_calibrate": each window for --num_train_epochs, then the output layer calibrated by
# first_label_calibration on at most this many training inputs' aggregate (bert_tf.runners.classifier).
CALIBRATION_INPUTS = 400
# first_label_calibration: the first label's logit moves by at most CALIBRATION_RANGE, every logit is scaled by a
# factor in CALIBRATION_SCALES (up to 10,000: on the subtle needle, 3 epochs at seed 3, the fit ran into a bound
# of 100), and the two are fitted in turn for at most CALIBRATION_ROUNDS rounds.
CALIBRATION_RANGE, CALIBRATION_SCALES, CALIBRATION_ROUNDS = 10.0, (0.01, 10_000.0), 20
# Top-k window selection (bert_tf.runners.classifier.run_select_stages; not a WINDOW_TRAINING: on the subtle needle
# of docs/finetuning.md it stayed at chance): after the each-window stage, SELECT_ROUNDS rounds of one epoch each
# over SELECT_TOP windows of every training input, re-chosen by the current model at each round (select_windows).
SELECT_TOP, SELECT_ROUNDS = 1, 3
# The default per aggregation, the one that measured better (docs/finetuning.md, "Texts longer than
# --max_seq_length"): on the needle task with real weights (1,600 documents, 5 seeds) each window alone ranked
# the documents well (AUC 0.98-0.99) but called "no" documents "yes" (accuracy 0.75-0.92 under max), the
# aggregate under any stayed at chance at some seeds (0.48 at seed 3), and each window then calibrated reached
# 0.92-0.97 under both max and any at every seed; on a spread-out label (mean) each window alone won 0.81 to 0.50.
# Under max, clean negatives since: on a subtle needle (800 documents, 3 epochs, seeds 12345, 2, 3) 0.570, 0.510,
# 0.570 against each window then calibrated's 0.560, 0.493, 0.507 and the oracle's 0.617, 0.557, 0.573; on the
# distinct one (800 documents, 3 epochs) 0.900, 0.913, 0.917.
DEFAULT_WINDOW_TRAINING = {"mean": "each", "max": "clean_negatives", "logmeanexp": "each",
                           "any": "each_then_calibrate", "first": "each"}


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


def check_window_settings(long_inputs: str, doc_stride: int, aggregation: str, training: Optional[str] = None) -> None:
    """ValueError (one line, in flag names) for settings no run can use; training None: the aggregation's default."""
    if long_inputs not in LONG_INPUTS:
        raise ValueError(f"--long_inputs must be one of {', '.join(LONG_INPUTS)}, got {long_inputs!r}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"--window_aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    if training is not None and training not in WINDOW_TRAINING:
        raise ValueError(f"--window_training must be one of {', '.join(WINDOW_TRAINING)}, got {training!r}")
    if training == "clean_negatives" and aggregation not in FOUND_SOMEWHERE:
        raise ValueError(f"--window_training=clean_negatives takes every window of a first-label input as that label "
                         f"('found nowhere'), which needs --window_aggregation {', '.join(FOUND_SOMEWHERE)}, "
                         f"not {aggregation}")
    if long_inputs == "windows" and doc_stride < 1:
        raise ValueError(f"--doc_stride must be positive, got {doc_stride}")


def aggregate_windows(outputs, window_example, num_examples: int, aggregation: str) -> np.ndarray:
    """Per-window outputs -> one output per input, as training and the export aggregate them.

    outputs: float [M, L] (logits, or [M, 1] regression values) of M windows, in input order
    (every input's windows together, first window first); window_example: int [M], the input
    each window belongs to (every input 0..N-1 has at least one window). aggregation: one of AGGREGATIONS,
    computed by bert_tf.tasks.window_aggregation.aggregate_slots (mean, max, logmeanexp, "any": a noisy-OR
    giving log-probabilities, or first; one window gives its own output) over the windows in slots
    (windows_in_slots), in float64. Returns [N, L] in the outputs' dtype.
    """
    from bert_tf.tasks.window_aggregation import aggregate_slots  # lazy: this module loads no TensorFlow

    outputs = np.asarray(outputs)
    window_example = np.asarray(window_example, np.int64)
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"window aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    if len(outputs) != len(window_example):
        raise ValueError(f"{len(outputs)} window outputs for {len(window_example)} windows")
    counts = np.bincount(window_example, minlength=num_examples)
    if len(counts) != num_examples or (counts == 0).any():
        raise ValueError(f"every one of the {num_examples} inputs needs at least one window")
    slots = windows_in_slots({"outputs": outputs.astype(np.float64)}, window_example, per_input=())
    return np.asarray(aggregate_slots(slots["outputs"], slots["window_mask"], aggregation)).astype(outputs.dtype)


def window_weights(window_example: Sequence[int]) -> np.ndarray:
    """float32 [M]: 1 / (number of windows of its input) for each window, so every input weighs 1 in a loss."""
    window_example = np.asarray(window_example, np.int64)
    counts = np.bincount(window_example)
    return (1.0 / counts[window_example]).astype(np.float32)


def any_start_bias(first_label_share: float, windows_per_input: float, num_labels: int) -> np.ndarray:
    """float32 [num_labels]: the output bias a fresh head starts with when training on the aggregate under "any",
    so that the noisy-OR of an input's windows starts at the training data's share of the first label
    ("found nowhere") rather than at ~1 - 0.5 ** windows for every input.

    With zero logits every window says "found" with probability (L-1)/L, and the product over ~8 windows says
    "found" for every input: the first steps' loss on each "nowhere" input is large and pushes every window of
    the encoder toward "nowhere" at once (the cold start of a sparse positive class, as RetinaNet's prior
    initialisation answers). Here each window says the first label with q = share ** (1 / windows_per_input)
    and the other labels share the rest equally; the share is clipped to [0.01, 0.99]."""
    if num_labels < 2:
        raise ValueError(f"window aggregation 'any' needs two or more labels, got {num_labels}")
    share = min(max(float(first_label_share), 0.01), 0.99)
    q = share ** (1.0 / max(float(windows_per_input), 1.0))
    bias = np.zeros(num_labels, np.float32)
    bias[0] = np.log(q / (1.0 - q)) + np.log(num_labels - 1)
    return bias


def first_label_calibration(logits, window_example, labels, aggregation: str) -> Tuple[float, float]:
    """(shift, scale): window logits l become scale * (l + shift on the first label), the pair that minimises the
    cross-entropy of the inputs' aggregated outputs (aggregate_windows) against their labels. Platt scaling for a
    model trained on each window alone, whose windows without the evidence lean toward their input's label: the
    shift sets the threshold, the scale how sure the aggregate is. A shift alone (scale 1) misses where the model's
    logits are squeezed: on the subtle needle (docs/finetuning.md) the documents' logit differences spanned 0.1, and
    a 1.5-point imbalance among the fitted inputs moved the shift-only fit past all of them. As Platt's, the targets
    are softened: an input of a label that n inputs have gets (n + 1) / (n + 2) on it and 1 / (n + 2) spread over the
    others, so where the aggregate separates the inputs the scale stays finite (probabilities up to ~0.995 for
    400 inputs) rather than running to its bound.

    logits float [M, L] (L >= 2) of M windows in input order, window_example int [M], labels int [N]. Fitted by
    alternating golden-section searches, the shift over [-CALIBRATION_RANGE, CALIBRATION_RANGE], the scale over
    CALIBRATION_SCALES (log-spaced); (0.0, 1.0) when the model is already calibrated."""
    logits = np.asarray(logits, np.float64)
    labels = np.asarray(labels, np.int64)
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"calibration needs two or more labels, got outputs of shape {logits.shape}")
    num_labels = logits.shape[1]
    first = np.eye(1, num_labels)[0]
    count = np.bincount(labels, minlength=num_labels)[labels].astype(np.float64)
    targets = np.repeat((1.0 / (count + 2.0) / (num_labels - 1))[:, None], num_labels, axis=1)
    targets[np.arange(len(labels)), labels] = (count + 1.0) / (count + 2.0)

    def loss(shift, scale):
        out = aggregate_windows(scale * (logits + shift * first), window_example, len(labels), aggregation)
        out = out - out.max(-1, keepdims=True)
        logp = out - np.log(np.exp(out).sum(-1, keepdims=True))
        return -(targets * logp).sum(-1).mean()

    shift, scale = 0.0, 1.0
    best = loss(shift, scale)
    low, high = np.log(CALIBRATION_SCALES)
    for _ in range(CALIBRATION_ROUNDS):
        shift = golden_minimum(lambda s, scale=scale: loss(s, scale), -CALIBRATION_RANGE, CALIBRATION_RANGE, shift)
        scale = float(np.exp(golden_minimum(lambda g, shift=shift: loss(shift, np.exp(g)), low, high, np.log(scale))))
        now = loss(shift, scale)
        if best - now < 1e-9:
            break
        best = now
    if loss(0.0, 1.0) <= best + 1e-9:
        return 0.0, 1.0
    return shift, scale


def golden_minimum(f: Callable[[float], float], low: float, high: float, start: float, tolerance: float = 1e-5) -> float:
    """The argument in [low, high] where f, assumed unimodal there, is least (golden-section search, to
    `tolerance`); `start` when no point found is lower than f(start)."""
    ratio = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tolerance:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    found = (a + b) / 2.0
    return found if f(found) < f(start) else start


def window_training_for(aggregation: str, training: Optional[str]) -> str:
    """The window training a run uses: `training`, or DEFAULT_WINDOW_TRAINING of the aggregation."""
    return training or DEFAULT_WINDOW_TRAINING[aggregation]


def windows_in_slots(arrays: Dict[str, np.ndarray], window_example: Sequence[int], per_input: Sequence[str],
                     slots: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Per-window arrays -> per-input arrays with every input's windows side by side, for training on the aggregate.

    arrays: name -> [M, ...] for M windows in input order (window_example int [M], as aggregate_windows);
    the names in `per_input` hold one value per input, the same in each of its windows (label_ids), and
    keep [N, ...] (their first window's). The others become [N, K, ...] with K `slots` (default: the most
    windows of any input), the input's windows first, all-zero rows after them; "window_mask" int32 [N, K]
    says which slots hold a window.

    Why slots rather than windows packed with an input id: a batch of B inputs is then B x K windows of one
    static shape (what XLA and TPUs need) and aggregating is a masked reduction over the K axis; an empty slot
    costs nothing under skip-padding (no real tokens) and a full window under XLA, where
    sum(K - windows) / (N * K) of the rows are empty (logged by the runner).
    """
    window_example = np.asarray(window_example, np.int64)
    counts = np.bincount(window_example)
    num_inputs, most = len(counts), int(counts.max()) if len(counts) else 0
    slots = most if slots is None else slots
    if slots < most:
        raise ValueError(f"an input has {most} windows, more than the {slots} slots")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(len(window_example)) - starts[window_example]  # each window's place among its input's
    if (slot < 0).any() or (np.diff(window_example) < 0).any():
        raise ValueError("windows must come in input order, each input's windows together")
    out = {}
    for name, value in arrays.items():
        value = np.asarray(value)
        if name in per_input:
            out[name] = value[starts]
            continue
        grid = np.zeros((num_inputs, slots) + value.shape[1:], value.dtype)
        grid[window_example, slot] = value
        out[name] = grid
    mask = np.zeros((num_inputs, slots), np.int32)
    mask[window_example, slot] = 1
    out["window_mask"] = mask
    return out


def select_windows(logits, window_example, labels, k: int):
    """Which training windows a round of "each_then_select" trains on, and with which label (multiple-instance
    learning's choice: a "yes" document's label belongs to the windows that hold its evidence, not to all of them).

    logits float [M, L] (L >= 2) of M windows in input order, by the current model; window_example int [M];
    labels int [N] of the N inputs. An input whose label y is not the first ("found"): its k windows with the
    largest margin logit[y] - logit[first], labelled y (those the model thinks hold the evidence); an input of
    the first label ("found nowhere"): its k windows with the largest margin of any other label over the first,
    labelled first (its hardest windows, those a max would call "found"). Ties: the earlier window. An input
    with fewer than k windows gives all of them. Returns (rows int [R] ascending, their labels int [R])."""
    logits = np.asarray(logits, np.float64)
    window_example = np.asarray(window_example, np.int64)
    labels = np.asarray(labels, np.int64)
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"window selection needs two or more labels, got outputs of shape {logits.shape}")
    if k < 1:
        raise ValueError(f"window selection needs k >= 1, got {k}")
    if len(logits) != len(window_example) or (np.diff(window_example) < 0).any():
        raise ValueError("window selection needs one window_example per window, in input order")
    label = labels[window_example]  # [M]: each window's input's label
    found = np.where(label > 0, logits[np.arange(len(logits)), label], logits[:, 1:].max(-1))
    margin = found - logits[:, 0]
    order = np.lexsort((-margin, window_example))  # by input, then largest margin first (stable: earlier first)
    starts = np.concatenate([[0], np.cumsum(np.bincount(window_example, minlength=len(labels)))[:-1]])
    rank = np.arange(len(order)) - starts[window_example[order]]  # each window's place in its input's order
    rows = np.sort(order[rank < k])
    return rows, label[rows]
