"""Serving a model trained on windows (classifier --long_inputs=windows, NER --doc_stride): long texts are
windowed inside the graph.

`windowed(ClassifierServing or RegressionServing, doc_stride, aggregation)` is that module with
its text signatures (serving_default, serve_text) cutting each text into the windows the runner
makes (bert_tf.tasks.glue.convert_examples_to_windows: windows over the text, or over text_b with
text_a whole in each, starts min(doc_stride, room) pieces apart, the last reaching the end),
running the model on every window and aggregating their logits per input as
bert_tf.tasks.windows.aggregate_windows does (one definition: bert_tf.tasks.window_aggregation; mean, max,
logmeanexp, any or first). serve_ids and preprocess stay one row per input (truncated). The export metadata
records the settings.

`windowed(TaggingServing, doc_stride)` is the tagger with serving_default cutting each text's pieces
into the windows run_ner.py makes with --doc_stride (bert_tf.tasks.conll) and tagging each word in
the window where its first piece has the most context (SQuAD's rule, as the runner:
bert_tf.tasks.windows.check_is_max_context), so every word of a long text gets one tag.

Dimensions: B inputs, W windows, S max_seq_length, L labels, N words.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from bert_tf.serving.module import our_names, string_spec
from bert_tf.serving.tagging import TaggingServing
from bert_tf.serving.tokenizer import pack_pair
from bert_tf.tasks.window_aggregation import aggregate_slots
from bert_tf.tasks.windows import AGGREGATIONS, MAX_CONTEXT_LENGTH_WEIGHT


def window_steps(n: tf.Tensor, room, doc_stride: int):
    """int64 [B] pieces to window, room (pieces per window, [B] or a number) -> (the pieces between two
    windows' starts, the number of windows) int64 [B] each: as bert_tf.tasks.windows.doc_spans_for."""
    room = tf.broadcast_to(tf.cast(room, tf.int64), tf.shape(n))
    step = tf.minimum(room, doc_stride)
    return step, 1 + (tf.maximum(n - room, 0) + step - 1) // step


def window_inputs(ids_a: tf.RaggedTensor, ids_b: tf.RaggedTensor, seq_length: int, doc_stride: int, cls_id, sep_id):
    """int64 [B, (T)] pieces of text_a and text_b (an empty text_b row: one text) ->
    (TF-Hub inputs int32 [W, S] of every window, the input of each window int32 [W], its windows' count [B])."""
    len_a = ids_a.row_lengths()
    pair = ids_b.row_lengths() > 0  # [B]
    keep_a = tf.RaggedTensor.from_row_lengths(tf.repeat(pair, len_a), len_a)
    fixed = tf.ragged.boolean_mask(ids_a, keep_a)  # text_a of pairs, empty for one text
    cut = tf.concat([tf.ragged.boolean_mask(ids_a, tf.logical_not(keep_a)), ids_b], axis=1)  # what windows run over
    room = tf.where(pair, seq_length - 3 - len_a, tf.cast(seq_length - 2, tf.int64))  # [B]
    tf.debugging.assert_positive(room, "a text_a leaves no room for text_b in max_seq_length")
    n = cut.row_lengths()
    step, count = window_steps(n, room, doc_stride)  # [B]
    example = tf.repeat(tf.range(tf.size(count, out_type=tf.int64)), count)  # [W]
    start = tf.ragged.range(count).flat_values * tf.gather(step, example)  # [W]
    length = tf.minimum(tf.gather(room, example), tf.gather(n, example) - start)
    positions = tf.ragged.range(start, start + length) + tf.gather(cut.row_starts(), example)[:, None]
    pieces = tf.gather(cut.flat_values, positions)  # [W, (T)]
    in_pair = tf.RaggedTensor.from_row_lengths(tf.repeat(tf.gather(pair, example), length), length)
    fixed_w = tf.gather(fixed, example)
    text_a = tf.concat([fixed_w, tf.ragged.boolean_mask(pieces, tf.logical_not(in_pair))], axis=1)
    text_b = tf.ragged.boolean_mask(pieces, in_pair)
    return pack_pair(text_a, text_b, seq_length, cls_id, sep_id), tf.cast(example, tf.int32), count


def max_context_windows(first: tf.RaggedTensor, n: tf.Tensor, room: int, doc_stride: int):
    """The window each piece is read in: of the windows holding it, the one giving it the most context.

    first: int64 [B, (N)] a piece of each word (its first) as an index among its text's pieces, n: int64 [B]
    the texts' piece counts, windowed as window_inputs does for one text (room max_seq_length - 2).
    Returns int64 [B, (N)] each: the window's index among all windows (window_inputs' order) and the
    piece's position in it (after [CLS]). The score is bert_tf.tasks.windows.check_is_max_context's
    (min(left, right) + 0.01 * window length, in float64 as there), the first window winning ties.
    """
    step, count = window_steps(n, room, doc_stride)  # [B]
    text = first.value_rowids()  # [N]
    piece = first.flat_values
    step_n, count_n, n_n = (tf.gather(x, text) for x in (step, count, n))
    # Window k holds the piece when k * step <= piece < k * step + room: lo..hi.
    lo = tf.maximum(tf.math.floordiv(piece - room, step_n) + 1, 0)
    hi = tf.minimum(piece // step_n, count_n - 1)
    candidates = tf.ragged.range(lo, hi + 1)  # [N, (K)]
    word = candidates.value_rowids()
    k = candidates.flat_values
    start = k * tf.gather(step_n, word)
    length = tf.minimum(tf.cast(room, tf.int64), tf.gather(n_n, word) - start)
    left = tf.gather(piece, word) - start
    score = tf.cast(tf.minimum(left, length - 1 - left), tf.float64) + \
        MAX_CONTEXT_LENGTH_WEIGHT * tf.cast(length, tf.float64)
    best = tf.gather(tf.math.segment_max(score, word), word)
    owner = tf.math.segment_min(tf.where(score == best, k, tf.reduce_max(count) + 1), word)  # [N]
    window = tf.gather(tf.cumsum(count, exclusive=True), text) + owner
    return first.with_flat_values(window), first.with_flat_values(piece - owner * step_n + 1)


def aggregate(logits: tf.Tensor, example: tf.Tensor, count: tf.Tensor, aggregation: str) -> tf.Tensor:
    """float [W, L] outputs of every window, example int [W] the input of each (window_inputs' order: each
    input's windows together, in order), count [B] each input's windows -> [B, L]:
    bert_tf.tasks.window_aggregation.aggregate_slots over the windows moved into slots [B, max(count), L]."""
    rows = tf.RaggedTensor.from_value_rowids(logits, tf.cast(example, tf.int64), nrows=tf.size(count, tf.int64))
    slots = rows.to_tensor()  # [B, K, L], empty slots zero (masked)
    return aggregate_slots(slots, tf.sequence_mask(rows.row_lengths(), tf.shape(slots, tf.int64)[1]), aggregation)


class _Windows:
    """The text signatures of a classifier serving module, windowed (mixed in by `windowed`)."""

    doc_stride = 128
    aggregation = "mean"

    @classmethod
    def metadata_entries(cls, options):
        return dict(super().metadata_entries(options), long_inputs="windows", doc_stride=cls.doc_stride,
                    window_aggregation=cls.aggregation)

    def _windowed_outputs(self, text_a, text_b):
        ids = self.tokenizer.tokenize(tf.concat([text_a, text_b], axis=0))  # one tokenizer pass, as _pack
        n = tf.shape(text_a)[0]
        hub, example, count = window_inputs(ids[:n], ids[n:], self.max_seq_length, self.doc_stride, self._cls_id,
                                            self._sep_id)
        logits = tf.cast(self._model(our_names(hub)), tf.float32)  # [W, L]
        return self._from_logits(aggregate(logits, example, count, self.aggregation))

    @tf.function(autograph=False, input_signature=[string_spec("text_a"), string_spec("text_b")])
    def serve_windowed_text(self, text_a, text_b):
        return self._windowed_outputs(text_a, text_b)

    @tf.function(autograph=False, input_signature=[string_spec("text")])
    def serve_windowed_single(self, text):
        return self._windowed_outputs(text, tf.fill(tf.shape(text), ""))

    def signatures(self):
        return dict(super().signatures(), serving_default=self.serve_windowed_text,
                    serve_text=self.serve_windowed_single)


class _TaggingWindows:
    """The tagger's serving_default, windowed (mixed in by `windowed`)."""

    doc_stride = 128

    @classmethod
    def metadata_entries(cls, options):
        return dict(super().metadata_entries(options), long_inputs="windows", doc_stride=cls.doc_stride,
                    window_tags="max_context")

    @tf.function(autograph=False, input_signature=[string_spec("text")])
    def serve_windowed_text(self, text):
        words, first, ids = self._words(text)  # [B, (N)], [B, (N)], [B, (T)]
        hub, _, _ = window_inputs(ids, ids[:, :0], self.max_seq_length, self.doc_stride, self._cls_id, self._sep_id)
        logits, _ = self._predict(hub)  # [W, S, L]
        window, position = max_context_windows(first, ids.row_lengths(), self.max_seq_length - 2, self.doc_stride)
        word_logits = tf.gather_nd(logits, tf.stack([window.flat_values, position.flat_values], axis=1))
        width = tf.maximum(self.max_seq_length, tf.cast(tf.reduce_max(words.row_lengths()), tf.int32))
        return self._word_outputs(words, words.with_flat_values(word_logits), width)

    def signatures(self):
        return dict(super().signatures(), serving_default=self.serve_windowed_text)


def windowed(serving_class: type, doc_stride: int, aggregation: Optional[str] = None) -> type:
    """`serving_class` with windowed text signatures: ClassifierServing or RegressionServing (aggregation
    mean, max, logmeanexp, any or first), or TaggingServing (no aggregation: each word is tagged in its max-context window)."""
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be positive, got {doc_stride}")
    if issubclass(serving_class, TaggingServing):
        if aggregation is not None:
            raise ValueError(f"a tagger tags each word in its max-context window; window aggregation {aggregation!r} "
                             "does not apply")
        mixin, settings = _TaggingWindows, {}
    else:
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"window aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
        mixin, settings = _Windows, {"aggregation": aggregation}
    return type(f"Windowed{serving_class.__name__}", (mixin, serving_class), {"doc_stride": int(doc_stride), **settings})
