"""TF-Hub's BERT preprocessing interface as a SavedModel: strings -> the encoder's int32 inputs, in-graph.

Why: TF-Hub's BERT workflow (TensorFlow's "classify text with BERT" tutorial, the
tf-models encoders) loads two SavedModels, a preprocessor and an encoder, and
wires them with `hub.KerasLayer`. This is the preprocessor half for a bert_tf
model: its tokenizer (bert_tf.serving.tokenizer, the same ids as FullTokenizer)
and vocab inside, the encoder half being the encoder export (encoder.py).

What is saved (TF-Hub's names and calling conventions):
  __call__(text)     string [B] -> input_word_ids, input_mask, input_type_ids
                     int32 [B, S], one segment at the export's seq_length S
                     (also the serving_default signature);
  tokenize(text)     string [B] -> int32 RaggedTensor [B, (W), (P)];
  bert_pack_inputs(segments, seq_length=S)
                     a list of 1 or 2 `tokenize` outputs -> the three int32
                     [B, seq_length] inputs: [CLS] A [SEP] (B [SEP]), type id 0
                     up to the first [SEP], 1 after it, mask 1 on them, 0-padded.
                     Segments are trimmed round-robin (one wordpiece to each
                     segment in turn until seq_length - 1 - #segments are given
                     out), TF-Hub's rule; for two segments it keeps the same
                     lengths as the original's longest-first truncation. A second
                     segment that is empty still gets its [SEP] (TF-Hub's layout;
                     the raw-text signatures treat text_b "" as one segment).

Dimensions: B batch, W words, P wordpieces of a word, S seq_length.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.serving.module import HUB_INPUTS, string_spec
from bert_tf.serving.tokenizer import InGraphTokenizer

MAX_SEGMENTS = 2  # bert_pack_inputs is saved for 1 .. MAX_SEGMENTS segments
TOKENIZED_SPEC = tf.RaggedTensorSpec([None, None, None], tf.int32, ragged_rank=2, row_splits_dtype=tf.int64)


class PreprocessorServing(tf.Module):
    """The TF-Hub BERT preprocessor of a vocab and casing, packing to `seq_length` by default."""

    def __init__(self, tokenizer: InGraphTokenizer, seq_length: int, metadata_file: str):
        super().__init__()
        self.tokenizer = tokenizer
        self.seq_length = int(seq_length)
        self.metadata = tf.saved_model.Asset(metadata_file)
        self._cls_id = tf.cast(tokenizer.lookup("[CLS]"), tf.int32)
        self._sep_id = tf.cast(tokenizer.lookup("[SEP]"), tf.int32)
        for segments in range(1, MAX_SEGMENTS + 1):  # the traces the SavedModel keeps
            specs = [TOKENIZED_SPEC] * segments
            self.bert_pack_inputs.get_concrete_function(specs)
            self.bert_pack_inputs.get_concrete_function(specs, seq_length=tf.TensorSpec([], tf.int32))

    @tf.function(autograph=False, input_signature=[string_spec("text")])
    def tokenize(self, text):
        """string [B] -> int32 [B, (W), (P)] wordpiece ids."""
        ids = self.tokenizer.wordpieces(self.tokenizer.words(text))  # int64 [B, (W), (P)]
        return ids.with_flat_values(tf.cast(ids.flat_values, tf.int32))

    def _pack(self, segments, seq_length):
        import tensorflow_text as tf_text

        pieces = [s.merge_dims(-2, -1) for s in segments]  # [B, (T)] each
        budget = seq_length - 1 - len(pieces)
        trimmed = tf_text.RoundRobinTrimmer(max_seq_length=budget).trim(pieces)
        ids, type_ids = tf_text.combine_segments(trimmed, start_of_sequence_id=self._cls_id,
                                                 end_of_segment_id=self._sep_id)  # [B, (<= seq_length)]
        word_ids, mask = tf_text.pad_model_inputs(ids, max_seq_length=seq_length)  # [B, seq_length] each
        type_ids, _ = tf_text.pad_model_inputs(type_ids, max_seq_length=seq_length)
        return dict(zip(HUB_INPUTS, (tf.cast(word_ids, tf.int32), tf.cast(mask, tf.int32),
                                     tf.cast(type_ids, tf.int32)), strict=True))

    @tf.function(autograph=False)
    def bert_pack_inputs(self, inputs, seq_length=None):
        """list of 1 or 2 int32 [B, (W), (P)] -> int32 [B, seq_length] each of the encoder's inputs."""
        return self._pack(list(inputs), self.seq_length if seq_length is None else seq_length)

    @tf.function(autograph=False, input_signature=[string_spec("text")])
    def __call__(self, text):
        """string [B] -> int32 [B, S] each of the encoder's inputs (one segment)."""
        return self._pack([self.tokenize(text)], self.seq_length)

    def signatures(self) -> dict:
        return {"serving_default": self.__call__}
