"""The paper's feature-based NER model (§5.3, Table 7): frozen BERT features -> 2-layer BiLSTM -> tags.

The encoder is frozen (not trainable, run without dropout, no gradient reaches
it); its layers are combined per token (`LayerCombination`, by default the
concatenation of the last four, the paper's best at 96.1 dev F1), and a
two-layer bidirectional LSTM with a linear output layer on top is trained.

Dimensions: B batch, S sequence, H hidden, H' combined feature size, U LSTM
units per direction, L labels.
"""

from __future__ import annotations

import keras
from keras import ops

from bert_tf.models.encoder import BertEncoder
from bert_tf.models.heads import HEAD_DTYPE, TokenTaggingHead
from bert_tf.models.layer_combination import LayerCombination, ScalarMix, combine_layers, parse_layer_combination

# The paper's best feature combination for CoNLL-2003 NER (Table 7).
DEFAULT_FEATURE_LAYERS = "concat_last:4"
# The paper's BiLSTM has two layers (§5.3).
NUM_LSTM_LAYERS = 2


@keras.saving.register_keras_serializable(package="bert_tf")
class BiLSTMFeatureTagger(keras.Model):
    """inputs (input_ids, input_mask, segment_ids int32 [B, S]) -> logits float32 [B, S, L].

    `lstm_units` per direction defaults to the encoder's hidden size (the
    paper: 768 for BERT-base). A combination asking for more layers than the
    encoder has uses all of them.
    """

    def __init__(self, encoder: BertEncoder, num_labels: int,
                 combination: LayerCombination | str = DEFAULT_FEATURE_LAYERS, lstm_units: int | None = None,
                 name: str = "bert_feature_tagger", **kwargs):
        super().__init__(name=name, **kwargs)
        if isinstance(combination, str):
            combination = parse_layer_combination(combination)
        config = encoder.config
        self.combination = combination.fit(config.num_hidden_layers)
        self.combination.layer_indexes(config.num_hidden_layers)  # one-line error for a bad layer index
        self.num_labels = num_labels
        self.lstm_units = lstm_units or config.hidden_size
        self.encoder = encoder
        self.encoder.trainable = False
        feature_size = self.combination.output_size(config.hidden_size)
        if self.combination.kind == "scalar_mix":
            self.scalar_mix = ScalarMix(config.num_hidden_layers)
            self.scalar_mix.build()
        else:
            self.scalar_mix = None
        for i in range(NUM_LSTM_LAYERS):
            lstm = keras.layers.Bidirectional(
                keras.layers.LSTM(self.lstm_units, return_sequences=True, dtype=HEAD_DTYPE),
                name=f"bilstm_{i}", dtype=HEAD_DTYPE)
            lstm.build((None, None, feature_size if i == 0 else 2 * self.lstm_units))
            setattr(self, f"bilstm_{i}", lstm)  # attributes, not a list: tf.train.Checkpoint tracks them
        self.head = TokenTaggingHead(num_labels, 2 * self.lstm_units, config.initializer_range)
        self.head.build()
        self.built = True  # every variable exists: no call is needed before saving

    def call(self, inputs, training=False):
        outputs = self.encoder(inputs, training=False)  # frozen: no dropout in the features either
        layers = [ops.stop_gradient(x) for x in outputs["encoder_outputs"]]
        if self.scalar_mix is not None:
            x = self.scalar_mix(layers)  # [B, S, H]
        else:
            x = combine_layers(layers, self.combination)  # [B, S, H']
        mask = ops.cast(inputs["input_mask"], "bool")  # [B, S]
        for i in range(NUM_LSTM_LAYERS):
            x = getattr(self, f"bilstm_{i}")(x, mask=mask, training=training)  # [B, S, 2U]
        # ops.copy drops the mask Keras attaches to the BiLSTM's output, which the position-wise head
        # would drop anyway, with a warning on every call.
        return self.head(ops.copy(x), training=training)  # [B, S, L]

    def get_config(self):
        return {"encoder": keras.saving.serialize_keras_object(self.encoder), "num_labels": self.num_labels,
                "combination": self.combination.spec, "lstm_units": self.lstm_units, "name": self.name}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(keras.saving.deserialize_keras_object(config.pop("encoder")), **config)
