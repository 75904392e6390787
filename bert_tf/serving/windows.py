"""Serving a classifier trained with --long_inputs=windows: long texts are windowed inside the graph.

`windowed(ClassifierServing or RegressionServing, doc_stride, aggregation)` is that module with
its text signatures (serving_default, serve_text) cutting each text into the windows the runner
makes (bert_tf.tasks.glue.convert_examples_to_windows: windows over the text, or over text_b with
text_a whole in each, starts min(doc_stride, room) pieces apart, the last reaching the end),
running the model on every window and aggregating their logits per input as
bert_tf.tasks.windows.aggregate_windows does (mean, max or first). serve_ids and preprocess stay
one row per input (truncated). The export metadata records the settings.

Dimensions: B inputs, W windows, S max_seq_length, L labels.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.serving.module import our_names, string_spec
from bert_tf.serving.tokenizer import pack_pair


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
    step = tf.minimum(room, doc_stride)
    n = cut.row_lengths()
    count = 1 + (tf.maximum(n - room, 0) + step - 1) // step  # [B]
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


def aggregate(logits: tf.Tensor, example: tf.Tensor, count: tf.Tensor, aggregation: str) -> tf.Tensor:
    """float [W, L] -> [B, L]: each input's windows' mean, per-unit max, or first window (windows in input order)."""
    if aggregation == "mean":
        return tf.math.segment_mean(logits, example)
    if aggregation == "max":
        return tf.math.segment_max(logits, example)
    if aggregation == "first":
        return tf.gather(logits, tf.cumsum(count, exclusive=True))
    raise ValueError(f"window aggregation must be mean, max or first, got {aggregation!r}")


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


def windowed(serving_class: type, doc_stride: int, aggregation: str) -> type:
    """`serving_class` (ClassifierServing or RegressionServing) with windowed text signatures."""
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be positive, got {doc_stride}")
    aggregate(tf.zeros([1, 1]), tf.zeros([1], tf.int32), tf.ones([1], tf.int64), aggregation)  # a bad name: now
    return type(f"Windowed{serving_class.__name__}", (_Windows, serving_class),
                {"doc_stride": int(doc_stride), "aggregation": aggregation})
