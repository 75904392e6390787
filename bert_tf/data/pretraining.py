"""Masked-LM / next-sentence instances from tokenized documents (docs/reference.md §6).

Pure and seeded: functions take plain data (token-id arrays, spans) and an
rng, and return plain data. The procedure is the original
`create_pretraining_data.py`'s, step for step:

  * per document a target length: max_seq_length - 3, or with probability
    `short_seq_prob` a uniform length in [2, max_seq_length - 3];
  * sentences accumulate into a chunk until the target (or the document
    ends); segment A is the chunk's first `a_end` sentences, `a_end` uniform
    in [1, len(chunk) - 1];
  * B is the rest of the chunk, or, with probability 0.5 and always when the
    chunk holds one sentence, sentences from a random start in a random
    *other* document (10 tries to avoid the same one) until B reaches
    target - len(A); the chunk's unused sentences are put back;
  * the pair is truncated to max_seq_length - 3 one token at a time from the
    longer side, front or back at random;
  * [CLS] A [SEP] B [SEP], segment 0 through the first [SEP];
  * num_to_predict = min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))
    positions (never [CLS]/[SEP]), each 80% [MASK], 10% kept, 10% a random
    vocab id; with whole-word masking a word and its ## pieces are chosen
    together (a group that would overshoot num_to_predict is skipped).

Differences from the original, all in *which* random draws are made, none in
the distributions: the random-next document is drawn from the documents of the
same block (bounded memory; `text_input.iter_blocks`) instead of the whole
corpus; masking draws its random numbers in one vectorized batch per block
(a uniform random subset of the candidates, as the original's shuffle gives);
instances are shuffled within a block, then through a bounded buffer, instead
of one global shuffle.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

# The original's constants (docs/reference.md §6).
RANDOM_NEXT_PROB = 0.5
MASK_TOKEN_PROB = 0.8  # replace with [MASK]
KEEP_TOKEN_PROB = 0.1  # keep the original token; the remaining 0.1 is a random vocab id
RANDOM_DOC_TRIES = 10
MIN_TARGET_LENGTH = 2
NUM_SPECIAL_TOKENS = 3  # [CLS], [SEP], [SEP]


@dataclass(frozen=True)
class InstanceOptions:
    """The flags that change instances; defaults are the original's."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    do_whole_word_mask: bool = False

    def validate(self) -> None:
        if self.max_seq_length < NUM_SPECIAL_TOKENS + MIN_TARGET_LENGTH:
            raise ValueError(f"max_seq_length: must be >= {NUM_SPECIAL_TOKENS + MIN_TARGET_LENGTH}, "
                             f"got {self.max_seq_length}")
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq: must be >= 1, got {self.max_predictions_per_seq}")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ValueError(f"masked_lm_prob: must be in (0, 1], got {self.masked_lm_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob: must be in [0, 1], got {self.short_seq_prob}")
        # A full-length sequence wants round(max_seq_length * masked_lm_prob)
        # predictions. Fewer slots silently lowers the masking rate of every
        # long sequence (a common mistake when raising max_seq_length to 512
        # and keeping 20), so it is an error rather than the original's cap.
        needed = max_predictions_needed(self.max_seq_length, self.masked_lm_prob)
        if self.max_predictions_per_seq < needed:
            raise ValueError(
                f"max_predictions_per_seq: {self.max_predictions_per_seq} is too small for max_seq_length "
                f"{self.max_seq_length} * masked_lm_prob {self.masked_lm_prob}; set it to at least {needed}")


def max_predictions_needed(max_seq_length: int, masked_lm_prob: float) -> int:
    """Predictions a full-length sequence asks for, rounded as the original (half to even)."""
    return max(1, int(round(max_seq_length * masked_lm_prob)))


@dataclass
class TokenizedBlock:
    """Documents as spans of one flat id array.

    Attributes:
      tokens: int32[T], the ids of every sentence of every document, concatenated.
      sentence_starts: list of int, len S + 1; sentence s is tokens[starts[s]:starts[s+1]].
      document_starts: list of int, len D + 1; document d is sentences
        document_starts[d] .. document_starts[d+1] - 1. Every document has at
        least one sentence and every sentence at least one token.
    """

    tokens: np.ndarray
    sentence_starts: List[int]
    document_starts: List[int]

    @property
    def num_documents(self) -> int:
        return len(self.document_starts) - 1


def build_block(documents: Sequence[Sequence[Sequence[int]]]) -> TokenizedBlock:
    """Documents (lists of sentences of ids) -> TokenizedBlock; empty sentences and documents are dropped."""
    flat: List[int] = []
    sentence_starts = [0]
    document_starts = [0]
    for doc in documents:
        before = len(sentence_starts)
        for sentence in doc:
            if sentence:
                flat.extend(sentence)
                sentence_starts.append(len(flat))
        if len(sentence_starts) > before:
            document_starts.append(len(sentence_starts) - 1)
    return TokenizedBlock(np.asarray(flat, dtype=np.int32), sentence_starts, document_starts)


# A pair of segments as spans of TokenizedBlock.tokens: (a_start, a_end, b_start, b_end, is_random_next).
Span = Tuple[int, int, int, int, int]


def document_pairs(block: TokenizedBlock, doc: int, max_seq_length: int, short_seq_prob: float,
                   rng: random.Random) -> List[Span]:
    """The A/B segment pairs of one document, truncated to fit (the original's per-document loop)."""
    starts = block.sentence_starts
    first, last = block.document_starts[doc], block.document_starts[doc + 1]
    max_num_tokens = max_seq_length - NUM_SPECIAL_TOKENS
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(MIN_TARGET_LENGTH, max_num_tokens)

    pairs: List[Span] = []
    chunk_first = first  # first sentence of the current chunk
    length = 0
    i = first
    while i < last:
        length += starts[i + 1] - starts[i]
        if i == last - 1 or length >= target:
            chunk_len = i - chunk_first + 1
            a_end = 1 if chunk_len < 2 else rng.randint(1, chunk_len - 1)
            a0, a1 = starts[chunk_first], starts[chunk_first + a_end]
            if chunk_len == 1 or rng.random() < RANDOM_NEXT_PROB:
                is_random = 1
                target_b = target - (a1 - a0)
                for _ in range(RANDOM_DOC_TRIES):
                    other = rng.randint(0, block.num_documents - 1)
                    if other != doc:
                        break
                o_first, o_last = block.document_starts[other], block.document_starts[other + 1]
                j = rng.randint(o_first, o_last - 1)
                b0 = starts[j]
                while starts[j + 1] - b0 < target_b and j + 1 < o_last:
                    j += 1
                b1 = starts[j + 1]
                i -= chunk_len - a_end  # put the unused sentences back
            else:
                is_random = 0
                b0, b1 = a1, starts[i + 1]
            # Truncate from the longer side, front or back at random.
            while (a1 - a0) + (b1 - b0) > max_num_tokens:
                if (a1 - a0) > (b1 - b0):
                    if rng.random() < 0.5:
                        a0 += 1
                    else:
                        a1 -= 1
                elif rng.random() < 0.5:
                    b0 += 1
                else:
                    b1 -= 1
            pairs.append((a0, a1, b0, b1, is_random))
            chunk_first = i + 1
            length = 0
        i += 1
    return pairs


@dataclass
class InstanceBatch:
    """N instances as arrays (all int32 unless noted).

    input_ids [N, max_seq_length] after masking, zero-padded; num_tokens [N]
    real tokens; num_segment_a [N] = len(A) + 2; masked_lm_positions and
    masked_lm_ids [N, max_predictions_per_seq], sorted by position,
    zero-padded; num_predictions [N]; next_sentence_labels [N].
    """

    input_ids: np.ndarray
    num_tokens: np.ndarray
    num_segment_a: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    num_predictions: np.ndarray
    next_sentence_labels: np.ndarray

    def __len__(self) -> int:
        return len(self.num_tokens)


def assemble(tokens: np.ndarray, spans: Sequence[Span], max_seq_length: int, cls_id: int, sep_id: int):
    """[CLS] A [SEP] B [SEP] per span, zero-padded.

    Returns input_ids int32[N, L], num_tokens int32[N], len_a int32[N], is_random int32[N].
    """
    s = np.asarray(spans, dtype=np.int64).reshape(-1, 5)  # [N, 5]
    a0, a1, b0, b1, is_random = (s[:, k:k + 1] for k in range(5))  # each [N, 1]
    la, lb = a1 - a0, b1 - b0
    col = np.arange(max_seq_length, dtype=np.int64)[None, :]  # [1, L]
    in_a = (col >= 1) & (col <= la)
    in_b = (col >= la + 2) & (col <= la + lb + 1)
    source = np.where(in_a, a0 + col - 1, b0 + col - la - 2)  # [N, L] index into tokens
    source = np.clip(source, 0, max(len(tokens) - 1, 0))
    ids = np.where(in_a | in_b, tokens[source], 0).astype(np.int32)
    rows = np.arange(len(s))
    ids[:, 0] = cls_id
    ids[rows, la[:, 0] + 1] = sep_id
    ids[rows, (la + lb)[:, 0] + 2] = sep_id
    return ids, (la + lb + 3)[:, 0].astype(np.int32), la[:, 0].astype(np.int32), is_random[:, 0].astype(np.int32)


def num_to_predict(num_tokens: np.ndarray, masked_lm_prob: float, max_predictions_per_seq: int) -> np.ndarray:
    """min(max_predictions, max(1, round(n * p))) per instance; np.rint rounds half to even like Python's round."""
    k = np.rint(num_tokens.astype(np.float64) * masked_lm_prob).astype(np.int64)
    return np.minimum(max_predictions_per_seq, np.maximum(1, k))


def _choose_positions(num_tokens, len_a, k, max_seq_length, rng: np.random.Generator):
    """A uniform random subset of k candidate positions per row ([CLS]/[SEP]/padding excluded).

    Returns positions int64[N, m] sorted with the chosen first, then L (m = min(max_pred, L)).
    """
    n = len(num_tokens)
    col = np.arange(max_seq_length)[None, :]  # [1, L]
    candidate = (col >= 1) & (col < num_tokens[:, None] - 1) & (col != len_a[:, None] + 1)
    keys = rng.random((n, max_seq_length))
    keys[~candidate] = 2.0
    m = int(min(k.max(initial=1), max_seq_length))
    order = np.argsort(keys, axis=1, kind="stable")[:, :m]  # [N, m] candidates in random order
    k_eff = np.minimum(k, candidate.sum(axis=1))
    chosen = np.arange(m)[None, :] < k_eff[:, None]
    return np.sort(np.where(chosen, order, max_seq_length), axis=1)


def make_instances(tokens: np.ndarray, spans: Sequence[Span], options: InstanceOptions, vocab_size: int,
                   cls_id: int, sep_id: int, mask_id: int, rng: np.random.Generator,
                   is_continuation: np.ndarray = None, mask: bool = True) -> InstanceBatch:
    """Lays out and masks a batch of segment pairs (`mask=False`: lays out only).

    Args:
      tokens: int32[T] the ids the spans point into.
      spans: N (a_start, a_end, b_start, b_end, is_random_next).
      vocab_size: random replacements are uniform over [0, vocab_size), as the
        original draws from every vocab entry.
      is_continuation: bool[vocab_size], True for "##" pieces; needed for
        whole-word masking.
    """
    L, P = options.max_seq_length, options.max_predictions_per_seq
    ids, num_tokens, len_a, is_random = assemble(tokens, spans, L, cls_id, sep_id)
    n = len(num_tokens)
    if not mask:  # dynamic masking: the tokens as they are, no predictions (drawn while training)
        empty = np.zeros((n, P), dtype=np.int32)
        return InstanceBatch(ids, num_tokens, len_a + 2, empty, empty, np.zeros(n, dtype=np.int32), is_random)
    k = num_to_predict(num_tokens, options.masked_lm_prob, P)
    if options.do_whole_word_mask:
        positions = _choose_whole_words(ids, num_tokens, len_a, k, is_continuation, L, rng)
    else:
        positions = _choose_positions(num_tokens, len_a, k, L, rng)
    valid = positions < L  # [N, m]
    m = positions.shape[1]
    positions = np.where(valid, positions, 0)
    labels = np.where(valid, np.take_along_axis(ids, positions, axis=1), 0)
    # 80% [MASK], 10% kept, 10% a random id: one uniform draw per prediction.
    u = rng.random((n, m))
    random_ids = rng.integers(0, vocab_size, size=(n, m))
    replacement = np.where(u < MASK_TOKEN_PROB, mask_id, np.where(u < MASK_TOKEN_PROB + KEEP_TOKEN_PROB,
                                                                  labels, random_ids))
    rows, cols = np.nonzero(valid)
    ids[rows, positions[rows, cols]] = replacement[rows, cols]

    out_pos = np.zeros((n, P), dtype=np.int32)
    out_ids = np.zeros((n, P), dtype=np.int32)
    w = min(m, P)
    out_pos[:, :w] = positions[:, :w]
    out_ids[:, :w] = labels[:, :w]
    return InstanceBatch(ids, num_tokens, len_a + 2, out_pos, out_ids, valid.sum(axis=1).astype(np.int32),
                         is_random)


def _choose_whole_words(ids, num_tokens, len_a, k, is_continuation, max_seq_length, rng):
    """Whole-word positions per row, sorted, then L (the original's whole-word masking).

    Candidate groups follow the original exactly: walking the non-[CLS]/[SEP]
    positions in order, a "##" piece joins the previous candidate's group
    (even across the middle [SEP], as in the original), anything else starts
    a new group. Groups are taken in random order while they fit in k.
    """
    if is_continuation is None:
        raise ValueError("whole-word masking needs is_continuation")
    n = len(num_tokens)
    m = int(min(k.max(initial=1), max_seq_length))
    out = np.full((n, m), max_seq_length, dtype=np.int64)
    cont = is_continuation[ids]  # [N, L] bool
    for r in range(n):
        sep = int(len_a[r]) + 1
        groups: List[List[int]] = []
        row_cont = cont[r].tolist()
        for pos in range(1, int(num_tokens[r]) - 1):
            if pos == sep:
                continue
            if row_cont[pos] and groups:
                groups[-1].append(pos)
            else:
                groups.append([pos])
        chosen: List[int] = []
        budget = int(k[r])
        for g in rng.permutation(len(groups)).tolist():
            if len(chosen) >= budget:
                break
            group = groups[g]
            if len(chosen) + len(group) > budget:
                continue
            chosen.extend(group)
        chosen.sort()
        out[r, :len(chosen)] = chosen
    return out


def block_instances(block: TokenizedBlock, options: InstanceOptions, seed_rng: random.Random,
                    mask_rng: np.random.Generator, vocab_size: int, cls_id: int, sep_id: int, mask_id: int,
                    is_continuation: np.ndarray = None, mask: bool = True) -> InstanceBatch:
    """All instances of one dupe pass over a block (documents in order).

    `seed_rng` draws the segment pairs (cheap scalar draws), `mask_rng` the
    masking (vectorized draws); the caller seeds both per (block, dupe pass).
    `mask=False` (dynamic masking) leaves the tokens unmasked and draws nothing from mask_rng.
    """
    spans: List[Span] = []
    for doc in range(block.num_documents):
        spans.extend(document_pairs(block, doc, options.max_seq_length, options.short_seq_prob, seed_rng))
    return make_instances(block.tokens, spans, options, vocab_size, cls_id, sep_id, mask_id, mask_rng,
                          is_continuation, mask)
