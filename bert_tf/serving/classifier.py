"""Serving a sentence(-pair) classifier (GLUE-style) or a regression model (STS-B).

Dimensions: B batch, L labels.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.errors import ExportError
from bert_tf.serving.module import ServingModule, ids_specs, our_names, string_spec


class ClassifierServing(ServingModule):
    """serving_default(text_a, text_b [B] string; text_b "" for one text) ->
    probabilities float32 [B, L], label string [B], label_id int64 [B], logits [B, L];
    serve_text(text [B] string) the same for one text. Regression: score float32 [B]."""

    regression = False

    def __init__(self, model, tokenizer, options, metadata_file, kept_variables=None):
        super().__init__(model, tokenizer, options, metadata_file, kept_variables)
        self._labels = None if self.regression else tf.constant(list(options.label_list))

    @classmethod
    def check_options(cls, options):
        if not cls.regression and not options.label_list:
            raise ExportError("classification export needs a label_list")

    def _outputs(self, hub):
        return self._from_logits(tf.cast(self._model(our_names(hub)), tf.float32))  # [B, L]

    def _from_logits(self, logits):
        if self.regression:
            return {"score": logits[:, 0]}
        label_id = tf.argmax(logits, axis=-1)
        return {"probabilities": tf.nn.softmax(logits, axis=-1), "logits": logits,
                "label_id": label_id, "label": tf.gather(self._labels, label_id)}

    @tf.function(autograph=False, input_signature=[string_spec("text_a"), string_spec("text_b")])
    def serve_text(self, text_a, text_b):
        return self._outputs(self._pack(text_a, text_b))

    @tf.function(autograph=False, input_signature=[string_spec("text")])
    def serve_single(self, text):
        return self._outputs(self._pack(text, tf.fill(tf.shape(text), "")))

    @tf.function(autograph=False, input_signature=[ids_specs()])
    def serve_ids(self, inputs):
        return self._outputs(inputs)

    @tf.function(autograph=False, input_signature=[string_spec("text_a"), string_spec("text_b")])
    def preprocess(self, text_a, text_b):
        return self._pack(text_a, text_b)

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_text": self.serve_single,
                "serve_ids": self.serve_ids, "preprocess": self.preprocess}


class RegressionServing(ClassifierServing):
    """The classifier's signatures with one output, score float32 [B] (no labels)."""

    regression = True
