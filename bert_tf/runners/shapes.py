"""Static batch shapes for XLA: a few sequence lengths chosen from the data, each batch cut to one.

Under XLA every distinct batch shape is one compiled program and every position of a batch is
computed, padding included. Padding every batch to max_seq_length is one program, but on a
GLUE-like mix at seq 128 only about a quarter of the positions are real tokens; cutting each batch
to its longest example (dynamic padding, rounded up to 16) leaves little padding but makes up to
S / 16 programs (24 at SQuAD's 384), each compiled in the middle of training. Here a handful of
lengths is chosen from the split's own length histogram, training batches are drawn by length
bucket (bert_tf.runners.arrays) and cut to their bucket's length: at most `max_shapes` programs,
most of the padding gone, and every batch still holds train_batch_size whole examples, so the
recipe (batch size, steps, learning-rate schedule) is the user's. Packing (--pack_sequences)
removes more padding but makes a batch count rows of several examples and does not apply to
every task (SQuAD), so it stays a choice.

Share of the positions computed that are real tokens, by number of chosen lengths (20,000 drawn
lengths; benchmarks/RESULTS.md, 2026-11-26):
  GLUE-like mix at 128 (bench_packing's CoLA/SST-2/MRPC mix, mean 27):  1: 21%, 2: 43%, 3: 60%, 4: 69%, 6: 78%, 8: 84%
  SQuAD-like at 384 (log-normal, median 160, sigma 0.4, mean 171):     1: 45%, 2: 68%, 3: 78%, 4: 83%, 6: 88%, 8: 91%
Four lengths take most of what more would give (six add 9 points on GLUE, 5 on SQuAD) and each
more is one more compilation of the training step and of prediction, so DEFAULT_LENGTH_BUCKETS is 4.

Dimensions: N examples, S max_seq_length, K chosen lengths.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

# How many lengths (compiled programs per batch size) a split's batches are cut to under XLA.
DEFAULT_LENGTH_BUCKETS = 4
# Chosen lengths are multiples of this (XLA and the GPU's matmul tiles like multiples of 8).
LENGTH_MULTIPLE = 8


def example_lengths(input_mask: np.ndarray) -> np.ndarray:
    """input_mask int [N, S] (or [N, C, S]: the longest choice) -> real tokens per example, int [N]."""
    mask = np.asarray(input_mask)
    counts = (mask != 0).sum(-1)
    return counts.reshape(len(mask), -1).max(-1) if mask.ndim > 2 else counts


def choose_lengths(lengths: Sequence[int], max_seq_length: int, max_shapes: int = DEFAULT_LENGTH_BUCKETS,
                   multiple: int = LENGTH_MULTIPLE) -> Tuple[int, ...]:
    """Up to `max_shapes` sequence lengths (ascending, multiples of `multiple` or max_seq_length) that
    minimise the positions computed when every example is padded to the shortest chosen length that
    holds it. Exact: dynamic programming over the histogram of lengths rounded up to `multiple`.
    The longest chosen length holds the longest example."""
    lengths = np.asarray(lengths, np.int64)
    if max_shapes < 1:
        raise ValueError(f"max_shapes must be >= 1, got {max_shapes}")
    if not len(lengths):
        return (max_seq_length,)
    rounded = np.minimum((np.maximum(lengths, 1) + multiple - 1) // multiple * multiple, max_seq_length)
    candidates, counts = np.unique(rounded, return_counts=True)  # [M] ascending, examples at each
    m = len(candidates)
    k = min(max_shapes, m)
    below = np.concatenate([[0], np.cumsum(counts)])  # examples at candidates[:j]
    # cost[j][i]: least positions for the examples at candidates[:i + 1] with j + 1 lengths, the last
    # being candidates[i]; the examples at candidates[p + 1 .. i] are padded to candidates[i].
    cost = np.full((k, m), np.inf)
    back = np.zeros((k, m), np.int64)
    cost[0] = below[1:] * candidates
    for j in range(1, k):
        for i in range(j, m):
            p = np.arange(j - 1, i)
            options = cost[j - 1, p] + (below[i + 1] - below[p + 1]) * candidates[i]
            best = int(np.argmin(options))
            cost[j, i], back[j, i] = options[best], p[best]
    j = int(np.argmin(cost[:, m - 1]))  # fewer lengths when more do not help (ties: the fewest)
    chosen, i = [], m - 1
    while j >= 0:
        chosen.append(int(candidates[i]))
        i, j = int(back[j, i]), j - 1
    return tuple(sorted(chosen))


def padded_to(lengths: Sequence[int], chosen: Sequence[int]) -> np.ndarray:
    """The chosen length each example is computed at: the shortest that holds it, int [N]."""
    chosen = np.asarray(sorted(chosen))
    return chosen[np.searchsorted(chosen, np.asarray(lengths), side="left")]


def real_share(lengths: Sequence[int], chosen: Sequence[int]) -> float:
    """Real tokens / positions computed when each example is padded to padded_to(lengths, chosen)."""
    lengths = np.asarray(lengths)
    return float(lengths.sum() / max(padded_to(lengths, chosen).sum(), 1))


def describe(split: str, lengths: Sequence[int], chosen: Sequence[int], batch_size: int, max_seq_length: int) -> str:
    """One log line: the shapes a split's batches take and the share of their positions that is real."""
    lengths = np.asarray(lengths)
    return (f"{split}: XLA batch shapes {', '.join(f'[{batch_size}, {n}]' for n in chosen)} chosen from "
            f"{len(lengths)} examples' lengths: {real_share(lengths, chosen):.1%} of positions real "
            f"(padded to {max_seq_length}: {lengths.sum() / max(len(lengths) * max_seq_length, 1):.1%})")


def training_compile_text(loop_history: Sequence[dict], programs: int) -> str:
    """How long compiling the training step took, from the Trainer's per-loop records ({steps, seconds,
    compile_seconds}): the first step, which the Trainer times apart (it compiles the first shape), plus
    the first loop's timed steps beyond the later loops' median seconds per step (the run's other shapes
    first come within them). The second part is an estimate: a host call cannot time its steps apart."""
    if not loop_history:  # (a rerun on a finished output_dir trains nothing)
        return f"training step at {programs} shape(s): nothing trained in this run"
    first = loop_history[0]
    first_step = float(first.get("compile_seconds", 0.0))
    timed = first["steps"] - (1 if first_step else 0)  # the steps `seconds` covers
    if len(loop_history) < 2 or not timed:
        return (f"training step at {programs} shape(s): first step {first_step:.1f} s (one loop: no later pace "
                "to set the other shapes' compile time apart)")
    pace = float(np.median([r["seconds"] / max(r["steps"], 1) for r in loop_history[1:]]))
    excess = max(0.0, first["seconds"] - timed * pace)
    return (f"training step at {programs} shape(s): ~{first_step + excess:.1f} s (the first step {first_step:.1f} s, "
            f"then {first['seconds']:.1f} s for {timed} steps at the later loops' {pace:.3f} s per step)")


__all__ = ["DEFAULT_LENGTH_BUCKETS", "LENGTH_MULTIPLE", "choose_lengths", "describe", "example_lengths",
           "padded_to", "real_share", "training_compile_text"]
