"""Serving an encoder (a pretrained checkpoint, or the encoder of any model directory), and
fine-tuning it through TF-Hub.

Besides the raw-text signatures every export has, the encoder export is a TF-Hub
"reusable SavedModel", so `hub.KerasLayer(export_dir, trainable=True)` fine-tunes
its weights (docs/reference.md §8):
  __call__(inputs, training=False)  the TF-Hub BERT encoder call, saved for
      training False and True (True: dropout on, as in fine-tuning);
  variables, trainable_variables    lists of the encoder's variables (a Keras
      layer wrapping the export adds them as its weights);
  regularization_losses             [] (BERT has no weight regularizers; weight
      decay belongs to the optimizer).
An int8 export (bert_tf.serving.quantize) holds its blocks' kernels as constants:
it has no trainable variables and its __call__ is saved for training=False only.

Dimensions: B batch, S max_seq_length (the call: any S <= max_position_embeddings), H hidden.
"""

from __future__ import annotations

import tensorflow as tf

from bert_tf.serving.module import ServingModule, ids_specs, our_names, pad_positions, string_spec


class EncoderServing(ServingModule):
    """serving_default(text_a, text_b [B] string) / serve_ids(TF-Hub ids) ->
    pooled_output [B, H], sequence_output [B, S, H], encoder_outputs, encoder_outputs_1, ... [B, S, H].
    Called as a function, the TF-Hub convention: dict in, dict out with encoder_outputs a list
    and default = pooled_output."""

    serves_encoder = True
    # tf.Module computes these as read-only properties; a reusable SavedModel saves them as
    # attributes of these names (class attributes here, so that instances can set them).
    variables = trainable_variables = regularization_losses = None

    def __init__(self, model, tokenizer, options, metadata_file, kept_variables=None):
        super().__init__(model, tokenizer, options, metadata_file, kept_variables=kept_variables)
        self.fine_tunable = kept_variables is None
        if self.fine_tunable:
            self.variables = list(model.variables)
            self.trainable_variables = list(model.trainable_variables)
        else:
            self.variables = list(kept_variables)
            self.trainable_variables = []
        self.regularization_losses = []
        for training in (False, True) if self.fine_tunable else (False,):
            self.__call__.get_concrete_function(ids_specs(), training=training)  # saved with the export

    def _outputs(self, hub):
        out = self._model_full_length(hub)
        result = {"pooled_output": tf.cast(out["pooled_output"], tf.float32),
                  "sequence_output": tf.cast(out["sequence_output"], tf.float32)}
        for i, layer in enumerate(out["encoder_outputs"]):
            result["encoder_outputs" if i == 0 else f"encoder_outputs_{i}"] = tf.cast(layer, tf.float32)
        return result

    def _model_full_length(self, hub):
        """The model's outputs with sequence_output and encoder_outputs padded back to S (zeros after the
        batch's used positions: ServingModule._model)."""
        out = self._model(our_names(hub))
        seq = tf.shape(hub["input_mask"])[1]
        return {"pooled_output": out["pooled_output"], "sequence_output": pad_positions(out["sequence_output"], seq),
                "encoder_outputs": [pad_positions(x, seq) for x in out["encoder_outputs"]]}

    @tf.function(autograph=False, input_signature=[string_spec("text_a"), string_spec("text_b")])
    def serve_text(self, text_a, text_b):
        return self._outputs(self._pack(text_a, text_b))

    @tf.function(autograph=False, input_signature=[ids_specs()])
    def serve_ids(self, inputs):
        return self._outputs(inputs)

    @tf.function(autograph=False)
    def __call__(self, inputs, training=False):
        """The TF-Hub calling convention: dict in, dict out with encoder_outputs as a list."""
        if training:
            out = self.model(our_names(inputs), training=True)
        else:
            out = self._model_full_length(inputs)
        return {"default": out["pooled_output"], "pooled_output": out["pooled_output"],
                "sequence_output": out["sequence_output"], "encoder_outputs": list(out["encoder_outputs"])}

    @tf.function(autograph=False, input_signature=[string_spec("text_a"), string_spec("text_b")])
    def preprocess(self, text_a, text_b):
        return self._pack(text_a, text_b)

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}
