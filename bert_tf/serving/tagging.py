"""Serving token tagging (CoNLL NER): one tag per word, read at its first wordpiece.

Dimensions: B batch, W words, P pieces of a word, T wordpieces, S max_seq_length, L labels.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.serving.module import (
    ServingModule,
    ServingOptionsError,
    ids_specs,
    our_names,
    pad_positions,
    string_spec,
)
from bert_tf.serving.tokenizer import pack_pair


class TaggingServing(ServingModule):
    """serving_default(text string [B]) -> words string [B, S] and tags string [B, S] ("" padding),
    num_words int32 [B]. A word's tag is the one predicted on its first wordpiece (the paper's
    CoNLL setup); words past max_seq_length - 2 pieces are dropped. serve_ids -> logits [B, S, L],
    tag (per position) string [B, S]."""

    def __init__(self, model, tokenizer, options, metadata_file, kept_variables=None):
        super().__init__(model, tokenizer, options, metadata_file, kept_variables)
        self._labels = tf.constant(list(options.label_list))

    @classmethod
    def check_options(cls, options):
        if not options.label_list:
            raise ServingOptionsError("tagging export needs a label_list")

    def _predict(self, hub):
        logits = pad_positions(tf.cast(self._model(our_names(hub)), tf.float32), tf.shape(hub["input_mask"])[1])  # [B, S, L]
        return logits, tf.argmax(logits, axis=-1, output_type=tf.int32)  # [B, S]

    @tf.function(autograph=False, input_signature=[string_spec("text")])
    def serve_text(self, text):
        words = self.tokenizer.words(text)  # [B, (W)]
        pieces = self.tokenizer.wordpieces(words)  # [B, (W), (P)]
        ids = pieces.merge_dims(-2, -1)  # [B, (T)]
        hub = pack_pair(ids, ids[:, :0], self.max_seq_length, self._cls_id, self._sep_id)
        _, predicted = self._predict(hub)
        counts = pieces.row_lengths(axis=2)  # [B, (W)]
        first = tf.math.cumsum(counts, axis=1, exclusive=True) + 1  # [B, (W)]: after [CLS]
        # A word survives if its first piece does; survivors are a prefix of each row.
        num_words = tf.reduce_sum(tf.cast(first <= self.max_seq_length - 2, tf.int32), axis=1)  # [B]
        shape = [None, self.max_seq_length]
        first = first.to_tensor(0, shape=shape)  # [B, S]
        valid = tf.range(self.max_seq_length)[None, :] < num_words[:, None]  # [B, S]
        tags = tf.gather(self._labels, tf.gather(predicted, tf.cast(first, tf.int32), batch_dims=1))  # [B, S]
        return {"words": tf.where(valid, words.to_tensor("", shape=shape), ""),
                "tags": tf.where(valid, tags, ""), "num_words": num_words}

    @tf.function(autograph=False, input_signature=[ids_specs()])
    def serve_ids(self, inputs):
        logits, predicted = self._predict(inputs)
        return {"logits": logits, "tag": tf.gather(self._labels, predicted)}

    @tf.function(autograph=False, input_signature=[string_spec("text")])
    def preprocess(self, text):
        return self._pack(text, tf.fill(tf.shape(text), ""))

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}
