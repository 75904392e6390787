"""Dynamic masking: masked-LM predictions drawn in the input pipeline, each time a sequence is read.

Records written with `create_pretraining_data.py --masking=dynamic` hold the tokens unmasked
(bert_tf/data/schema.py); `draw_masks` gives them the original's masked_lm_* features, so the
model, packing, evaluation and every strategy see what static records give. The rule is the
original's (docs/reference.md §6), per sequence of n real tokens:
  * k = min(max_predictions_per_seq, max(1, round(n * masked_lm_prob))) predictions (fewer when
    the sequence has fewer candidates), candidates being every real token but [CLS] and [SEP];
  * the candidates (with whole-word masking: the words, a word being a candidate and the "##"
    pieces after it, even across the middle [SEP] as in the original) are taken in a uniformly
    random order while they fit in k (a word that would overshoot is skipped);
  * each chosen token becomes [MASK] 80%, stays 10%, a uniform random vocab id 10%;
  * masked_lm_positions sorted, then zero-padded with weight 0.

Deterministic and resumable (RoBERTa draws new masks per epoch; we draw them per read): every
random number comes from stateless ops keyed on (seed, input pipeline, batch index in that
pipeline). The batch index is a `Dataset.enumerate` inside the pipeline, so a resumed run, whose
tf.data position is restored or whose consumed batches are skipped (training/checkpointing.py),
draws the masks an uninterrupted run draws; different input pipelines (workers) never share a key.

Vectorised over the batch: [B, L] tensor ops, no per-example map (the whole-word greedy fill is
one `tf.scan` over the L word slots, [B] wide).

Dimensions: B batch, L max_seq_length, P max_predictions_per_seq, V vocab size.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

from bert_tf.data.pretraining import KEEP_TOKEN_PROB, MASK_TOKEN_PROB
from bert_tf.errors import InputDataError

# Evaluation draws its masks with this seed whatever the training seed: the same masks on every
# run over the same eval files and eval batch size, so eval curves of different runs compare.
EVAL_MASK_SEED = 20181011  # (BERT's arXiv date)
# Key streams: which draw a stateless op makes (word order, mask/keep/random choice, random id).
_ORDER, _CHOICE, _RANDOM_ID = 0, 1, 2


MaskingError = InputDataError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


@dataclasses.dataclass(frozen=True)
class MaskingOptions:
    """What draw_masks needs: the rule's numbers and the vocab's ids.

    is_continuation: bool [V], True for "##" pieces (whole-word masking reads it).
    """

    max_predictions_per_seq: int
    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int
    masked_lm_prob: float = 0.15
    do_whole_word_mask: bool = False
    is_continuation: Optional[Sequence[bool]] = dataclasses.field(default=None, compare=False, repr=False)


def options_from_vocab(vocab: Dict[str, int], max_predictions_per_seq: int, masked_lm_prob: float = 0.15,
                       do_whole_word_mask: bool = False, vocab_file: str = "vocab") -> MaskingOptions:
    """MaskingOptions from a token -> id vocab; InputDataError naming the file when a special token is missing."""
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in vocab]
    if missing:
        raise InputDataError(f"{vocab_file}: no {', '.join(missing)} token; dynamic masking needs [CLS], [SEP] and [MASK]")
    if not 0.0 < masked_lm_prob <= 1.0:
        raise InputDataError(f"masked_lm_prob must be in (0, 1], got {masked_lm_prob}")
    size = max(vocab.values()) + 1
    is_continuation = np.zeros(size, dtype=bool)
    for token, i in vocab.items():
        if token.startswith("##"):
            is_continuation[i] = True
    return MaskingOptions(max_predictions_per_seq, size, vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"],
                          masked_lm_prob, do_whole_word_mask, tuple(is_continuation.tolist()))


def batch_key(seed: int, pipeline_id: int, batch_index) -> tf.Tensor:
    """The stateless-op key of one batch: int64 [3] (seed, input pipeline, batch index)."""
    return tf.stack([tf.constant(seed, tf.int64), tf.constant(pipeline_id, tf.int64),
                     tf.cast(batch_index, tf.int64)])


def _seed(key: tf.Tensor, stream: int) -> tf.Tensor:
    """An int32 [2] stateless seed for one stream of one key (stateless_fold_in keeps streams apart)."""
    seed = tf.random.experimental.stateless_fold_in(key[:2], key[2])
    return tf.random.experimental.stateless_fold_in(seed, stream)


def draw_masks(features: Dict[str, tf.Tensor], key: tf.Tensor, options: MaskingOptions) -> Dict[str, tf.Tensor]:
    """Masks a batch of unmasked instances (schema DYNAMIC, parsed): the original's features.

    Args:
      features: int32 input_ids, input_mask, segment_ids [B, L] and next_sentence_labels [B, 1]
        (anything else passes through).
      key: int64 [3] from batch_key.
    Returns the features with input_ids masked and int32 masked_lm_positions, masked_lm_ids,
    float32 masked_lm_weights [B, P] added.
    """
    ids = features["input_ids"]  # [B, L]
    batch, length = tf.shape(ids)[0], ids.shape[1]
    P = options.max_predictions_per_seq
    real = features["input_mask"] > 0  # [B, L]
    candidate = real & (ids != options.cls_id) & (ids != options.sep_id)
    # k per row, rounded half to even as the original's round() (tf.round does the same).
    num_real = tf.reduce_sum(tf.cast(real, tf.float32), axis=1)  # [B]
    k = tf.cast(tf.round(num_real * options.masked_lm_prob), tf.int32)
    k = tf.minimum(P, tf.maximum(1, k))

    # Words: a candidate starts one unless it is a "##" piece after an earlier candidate.
    first = tf.cumsum(tf.cast(candidate, tf.int32), axis=1, exclusive=True) == 0  # no candidate before
    if options.do_whole_word_mask:
        table = tf.constant(np.asarray(options.is_continuation, dtype=bool))
        piece = tf.gather(table, tf.clip_by_value(ids, 0, len(options.is_continuation) - 1))
        starts = candidate & (~piece | first)
    else:
        starts = candidate
    word = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1  # [B, L] word index of each candidate
    word = tf.where(candidate, word, length)  # non-candidates: the slot past the last word
    rows = tf.range(batch)[:, None]  # [B, 1]
    sizes = tf.math.unsorted_segment_sum(tf.ones_like(word), word + rows * (length + 1),
                                         batch * (length + 1))
    sizes = tf.reshape(sizes, [batch, length + 1])[:, :length]  # [B, L] tokens per word slot (0: no word)

    # Words in a uniformly random order (empty slots last), taken while they fit in k.
    noise = tf.random.stateless_uniform([batch, length], _seed(key, _ORDER))
    order = tf.argsort(tf.where(sizes > 0, noise, 2.0), axis=1, stable=True)  # [B, L]
    ordered = tf.gather(sizes, order, batch_dims=1)  # [B, L]
    if options.do_whole_word_mask:
        def fill(chosen, size):  # [B], [B]: a word joins when it fits in what is left
            return chosen + tf.where(chosen + size <= k, size, 0)
        totals = tf.transpose(tf.scan(fill, tf.transpose(ordered), initializer=tf.zeros_like(k)))  # [B, L]
        before = tf.concat([tf.zeros_like(totals[:, :1]), totals[:, :-1]], axis=1)
        take = totals > before
    else:
        take = tf.cumsum(ordered, axis=1) <= k[:, None]  # every word one token: the first k
    taken = tf.gather(take, tf.argsort(order, axis=1), batch_dims=1)  # [B, L] by word slot
    taken = tf.concat([taken, tf.zeros_like(taken[:, :1])], axis=1)  # the non-candidates' slot
    selected = tf.gather(taken, word, batch_dims=1) & candidate  # [B, L]

    # Positions in order, then padding: the chosen columns sort first.
    col = tf.range(length)[None, :]
    sort_key = tf.where(selected, col, length + col)
    positions = -tf.math.top_k(-sort_key, k=P, sorted=True).values  # [B, P]
    valid = tf.range(P)[None, :] < tf.reduce_sum(tf.cast(selected, tf.int32), axis=1, keepdims=True)
    positions = tf.where(valid, positions, 0)
    labels = tf.where(valid, tf.gather(ids, positions, batch_dims=1), 0)  # [B, P]

    # 80% [MASK], 10% kept, 10% a random id: one uniform draw per prediction.
    u = tf.random.stateless_uniform([batch, P], _seed(key, _CHOICE))
    random_ids = tf.random.stateless_uniform([batch, P], _seed(key, _RANDOM_ID), minval=0,
                                             maxval=options.vocab_size, dtype=tf.int32)
    replacement = tf.where(u < MASK_TOKEN_PROB, options.mask_id,
                           tf.where(u < MASK_TOKEN_PROB + KEEP_TOKEN_PROB, labels, random_ids))
    # Padding slots write position 0's own id back ([CLS]); real positions are never 0.
    replacement = tf.where(valid, replacement, ids[:, :1])
    index = tf.stack([tf.broadcast_to(rows, tf.shape(positions)), positions], axis=-1)  # [B, P, 2]
    masked = tf.tensor_scatter_nd_update(ids, index, replacement)
    return dict(features, input_ids=masked, masked_lm_positions=positions, masked_lm_ids=labels,
                masked_lm_weights=tf.cast(valid, tf.float32))
