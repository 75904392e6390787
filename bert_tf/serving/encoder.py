"""Serving an encoder (a pretrained checkpoint, or the encoder of any model directory).

Dimensions: B batch, S max_seq_length, H hidden.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.serving.module import ServingModule, ids_specs, our_names, string_spec


class EncoderServing(ServingModule):
    """serving_default(text_a, text_b [B] string) / serve_ids(TF-Hub ids) ->
    pooled_output [B, H], sequence_output [B, S, H], encoder_outputs, encoder_outputs_1, ... [B, S, H].
    Called as a function, the TF-Hub convention: dict in, dict out with encoder_outputs a list."""

    serves_encoder = True

    def _outputs(self, hub):
        out = self._model(our_names(hub))
        result = {"pooled_output": tf.cast(out["pooled_output"], tf.float32),
                  "sequence_output": tf.cast(out["sequence_output"], tf.float32)}
        for i, layer in enumerate(out["encoder_outputs"]):
            result["encoder_outputs" if i == 0 else f"encoder_outputs_{i}"] = tf.cast(layer, tf.float32)
        return result

    @tf.function(autograph=False, input_signature=[string_spec("text_a"), string_spec("text_b")])
    def serve_text(self, text_a, text_b):
        return self._outputs(self._pack(text_a, text_b))

    @tf.function(autograph=False, input_signature=[ids_specs()])
    def serve_ids(self, inputs):
        return self._outputs(inputs)

    @tf.function(autograph=False, input_signature=[ids_specs()])
    def __call__(self, inputs):
        """The TF-Hub calling convention: dict in, dict out with encoder_outputs as a list."""
        out = self._model(our_names(inputs))
        return {"pooled_output": out["pooled_output"], "sequence_output": out["sequence_output"],
                "encoder_outputs": list(out["encoder_outputs"])}

    @tf.function(autograph=False, input_signature=[string_spec("text_a"), string_spec("text_b")])
    def preprocess(self, text_a, text_b):
        return self._pack(text_a, text_b)

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}
