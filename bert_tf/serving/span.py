"""Serving extractive question answering (SQuAD): the best answer span, found in the graph.

Dimensions: B batch, S max_seq_length.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.errors import ExportError
from bert_tf.serving.module import ServingModule, ids_specs, our_names, pad_positions, string_spec
from bert_tf.serving.tokenizer import pack_pair


class SpanServing(ServingModule):
    """serving_default(question, context [B] string) -> start_logits, end_logits float32 [B, S],
    answer_start, answer_end int32 [B] (token positions, inclusive), answer_score float32 [B],
    answer_text string [B] (the answer's wordpieces joined: lower-cased for uncased models).

    One window per question: the question is cut to max_query_length pieces and
    the context to what remains of max_seq_length (no doc_stride windows)."""

    def __init__(self, model, tokenizer, options, metadata_file, kept_variables=None):
        super().__init__(model, tokenizer, options, metadata_file, kept_variables)
        self.max_query_length = int(options.max_query_length)
        self.max_answer_length = int(options.max_answer_length)

    @classmethod
    def check_options(cls, options):
        if options.max_seq_length <= options.max_query_length + 3:
            raise ExportError(f"max_seq_length {options.max_seq_length} leaves no room for a context after "
                                      f"max_query_length {options.max_query_length}")

    @classmethod
    def metadata_entries(cls, options):
        return {"max_query_length": int(options.max_query_length),
                "max_answer_length": int(options.max_answer_length)}

    def _pack_qa(self, question, context):
        ids = self.tokenizer.tokenize(tf.concat([question, context], axis=0))  # [2N, (T)]
        n = tf.shape(question)[0]
        q, c = ids[:n], ids[n:]
        len_q = tf.minimum(q.row_lengths(), self.max_query_length)
        len_c = tf.minimum(c.row_lengths(), self.max_seq_length - 3 - len_q)
        return pack_pair(q, c, self.max_seq_length, self._cls_id, self._sep_id, len_a=len_q, len_b=len_c)

    def _outputs(self, hub):
        out = self._model(our_names(hub))
        seq = tf.shape(hub["input_mask"])[1]
        start, end = (pad_positions(tf.cast(out[k], tf.float32), seq) for k in ("start_logits", "end_logits"))  # [B, S]
        positions = tf.range(seq)[None, :]  # [1, S]
        last = tf.reduce_sum(hub["input_mask"], axis=1, keepdims=True) - 1  # [B, 1]: the final [SEP]
        in_context = tf.logical_and(tf.equal(hub["input_type_ids"], 1), positions < last)  # [B, S]
        offset = positions[0][None, :] - positions[0][:, None]  # [S, S]: end - start
        allowed = tf.logical_and(offset >= 0, offset < self.max_answer_length)[None]  # [1, S, S]
        allowed = allowed & in_context[:, :, None] & in_context[:, None, :]  # [B, S, S]
        scores = start[:, :, None] + end[:, None, :]  # [B, S, S]
        scores = tf.where(allowed, scores, tf.float32.min)
        best = tf.argmax(tf.reshape(scores, [-1, seq * seq]), axis=1, output_type=tf.int32)  # [B]
        a_start, a_end = best // seq, best % seq
        has_span = tf.reduce_any(in_context, axis=1)
        a_start = tf.where(has_span, a_start, 0)
        a_end = tf.where(has_span, a_end, 0)
        score = tf.where(has_span, tf.gather(tf.reshape(scores, [-1, seq * seq]), best, batch_dims=1), 0.0)
        take = tf.logical_and(positions >= a_start[:, None], positions <= a_end[:, None]) & has_span[:, None]
        pieces = self.tokenizer.id_to_token.lookup(tf.cast(hub["input_word_ids"], tf.int64))  # [B, S]
        joined = tf.strings.reduce_join(tf.where(take, pieces, ""), axis=1, separator=" ")
        joined = tf.strings.strip(tf.strings.regex_replace(joined, " +", " "))
        text = tf.strings.regex_replace(joined, " ##", "")
        return {"start_logits": start, "end_logits": end, "answer_start": a_start, "answer_end": a_end,
                "answer_score": score, "answer_text": text}

    @tf.function(autograph=False, input_signature=[string_spec("question"), string_spec("context")])
    def serve_text(self, question, context):
        return self._outputs(self._pack_qa(question, context))

    @tf.function(autograph=False, input_signature=[ids_specs()])
    def serve_ids(self, inputs):
        out = self._model(our_names(inputs))
        return {"start_logits": tf.cast(out["start_logits"], tf.float32),
                "end_logits": tf.cast(out["end_logits"], tf.float32)}

    @tf.function(autograph=False, input_signature=[string_spec("question"), string_spec("context")])
    def preprocess(self, question, context):
        return self._pack_qa(question, context)

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}
