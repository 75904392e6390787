"""Serving token tagging (CoNLL NER): one tag per word, read at its first wordpiece.

Dimensions: B batch, W words, P pieces of a word, T wordpieces, S max_seq_length, L labels.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.errors import ExportError
from bert_tf.serving.module import ServingModule, ids_specs, our_names, pad_positions, string_spec
from bert_tf.serving.tokenizer import pack_pair


class TaggingServing(ServingModule):
    """serving_default(text string [B]) -> words string [B, S] and tags string [B, S] ("" padding),
    probabilities float32 [B, S, L] (each word's tag distribution, zeros padding), num_words int32 [B].
    A word's tag is the one predicted on its first wordpiece (the paper's CoNLL setup); words past
    max_seq_length - 2 pieces are dropped (bert_tf.serving.windows: a tagger trained with --doc_stride
    windows them instead). serve_ids -> logits [B, S, L], tag (per position) string [B, S]."""

    def __init__(self, model, tokenizer, options, metadata_file, kept_variables=None):
        super().__init__(model, tokenizer, options, metadata_file, kept_variables)
        self._labels = tf.constant(list(options.label_list))

    @classmethod
    def check_options(cls, options):
        if not options.label_list:
            raise ExportError("tagging export needs a label_list")

    def _predict(self, hub):
        logits = pad_positions(tf.cast(self._model(our_names(hub)), tf.float32), tf.shape(hub["input_mask"])[1])  # [B, S, L]
        return logits, tf.argmax(logits, axis=-1, output_type=tf.int32)  # [B, S]

    def _word_outputs(self, words, word_logits, width):
        """words string [B, (W)] and their logits float32 [B, (W), L] -> serving_default's outputs, padded to
        [B, width] ("" / zeros past each row's words)."""
        flat = word_logits.flat_values  # [all words, L]
        predicted = word_logits.with_flat_values(tf.argmax(flat, axis=-1, output_type=tf.int32))
        probabilities = word_logits.with_flat_values(tf.nn.softmax(flat, axis=-1))
        shape = tf.stack([tf.shape(words.row_lengths())[0], width])
        return {"words": words.to_tensor("", shape=shape),
                "tags": tf.gather(self._labels, predicted).to_tensor("", shape=shape),
                "probabilities": probabilities.to_tensor(0.0, shape=tf.concat([shape, [tf.shape(flat)[1]]], 0)),
                "num_words": tf.cast(words.row_lengths(), tf.int32)}

    def _words(self, text):
        """string [B] -> words string [B, (W)], the index of each word's first piece among its text's pieces
        int64 [B, (W)], the pieces' ids int64 [B, (T)]."""
        words = self.tokenizer.words(text)
        pieces = self.tokenizer.wordpieces(words)  # [B, (W), (P)]
        return words, tf.math.cumsum(pieces.row_lengths(axis=2), axis=1, exclusive=True), pieces.merge_dims(-2, -1)

    @tf.function(autograph=False, input_signature=[string_spec("text")])
    def serve_text(self, text):
        words, first, ids = self._words(text)
        hub = pack_pair(ids, ids[:, :0], self.max_seq_length, self._cls_id, self._sep_id)
        logits, _ = self._predict(hub)  # [B, S, L]
        first += 1  # after [CLS]
        # A word survives if its first piece does; survivors are a prefix of each row.
        kept = first <= self.max_seq_length - 2
        first = tf.ragged.boolean_mask(first, kept)
        at = tf.stack([first.value_rowids(), first.flat_values], axis=1)
        return self._word_outputs(tf.ragged.boolean_mask(words, kept), first.with_flat_values(tf.gather_nd(logits, at)),
                                  self.max_seq_length)

    @tf.function(autograph=False, input_signature=[ids_specs()])
    def serve_ids(self, inputs):
        logits, predicted = self._predict(inputs)
        return {"logits": logits, "tag": tf.gather(self._labels, predicted)}

    @tf.function(autograph=False, input_signature=[string_spec("text")])
    def preprocess(self, text):
        return self._pack(text, tf.fill(tf.shape(text), ""))

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}
