"""Serving multiple choice (SWAG): one score per (context, choice), softmax over the choices.

Dimensions: B batch, C choices, S max_seq_length.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.errors import ExportError
from bert_tf.serving.module import ServingModule, ids_specs, our_names, string_spec


class MultipleChoiceServing(ServingModule):
    """serving_default(context string [B], choices string [B, C]) ->
    probabilities float32 [B, C], logits [B, C], choice int64 [B]. Each choice
    is packed as [CLS] context [SEP] choice [SEP] (SWAG: choice = sent2 + " " + ending)."""

    ids_rank = 3

    def __init__(self, model, tokenizer, options, metadata_file, kept_variables=None):
        super().__init__(model, tokenizer, options, metadata_file, kept_variables)
        self.num_choices = int(options.num_choices)

    @classmethod
    def check_options(cls, options):
        if not isinstance(options.num_choices, int) or options.num_choices < 2:
            raise ExportError(f"multiple_choice export needs num_choices >= 2, got {options.num_choices}")

    def _pack_choices(self, context, choices):
        flat_context = tf.reshape(tf.repeat(context[:, None], self.num_choices, axis=1), [-1])  # [B * C]
        hub = self._pack(flat_context, tf.reshape(choices, [-1]))  # [B * C, S]
        return {k: tf.reshape(v, [-1, self.num_choices, self.max_seq_length]) for k, v in hub.items()}  # [B, C, S]

    def _outputs(self, hub):
        logits = tf.cast(self._model(our_names(hub)), tf.float32)  # [B, C]
        return {"probabilities": tf.nn.softmax(logits, axis=-1), "logits": logits,
                "choice": tf.argmax(logits, axis=-1)}

    @tf.function(autograph=False, input_signature=[string_spec("context"), string_spec("choices", (None, None))])
    def serve_text(self, context, choices):
        return self._outputs(self._pack_choices(context, choices))

    @tf.function(autograph=False, input_signature=[ids_specs(rank=3)])
    def serve_ids(self, inputs):
        return self._outputs(inputs)

    @tf.function(autograph=False, input_signature=[string_spec("context"), string_spec("choices", (None, None))])
    def preprocess(self, context, choices):
        return self._pack_choices(context, choices)

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}
