"""The BERT encoder: embeddings -> post-LN Transformer blocks -> tanh pooler (docs/reference.md §3).

Dimensions: B batch, S sequence length (any S <= max_position_embeddings), H hidden.
"""

from __future__ import annotations

import keras
from keras import ops

from bert_tf.configs import BertConfig
from bert_tf.layers import BertEmbeddings, TransformerBlock
from bert_tf.layers.layout import TokenLayout

INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")


class BertEncoder(keras.Model):
    """BERT encoder built from a `BertConfig`.

    Called on a dict with int32 [B, S] `input_ids`, `input_mask`, `segment_ids`,
    it returns a dict:
      sequence_output: [B, S, H], the last block's output;
      pooled_output:   [B, H], tanh(dense(sequence_output[:, 0]));
      encoder_outputs: list of num_hidden_layers tensors [B, S, H], one per block.
    Outputs are in the layer compute dtype (bfloat16/float16 under a mixed
    policy); softmax and LayerNorm always run in float32.

    Variables exist as soon as the encoder is constructed, so checkpoints can be
    loaded before the first call. Layer names are stable: embeddings,
    layer_{i}, pooler; `bert_tf.checkpoints` maps them to the original names.

    `causal=True` is the left-to-right encoder of the paper's "LTR & No NSP"
    ablation (§5.1): every position attends only to itself and earlier ones,
    and the pooler reads the last real token (the only one that has seen the
    whole input, as GPT's classifier does) instead of [CLS]. The weights are
    the same variables, so checkpoints do not say whether they are causal; the
    model directory's bert_tf_info.json does ("causal_attention").
    """

    def __init__(self, config: BertConfig, name: str = "bert", causal: bool = False, **kwargs):
        super().__init__(name=name, **kwargs)
        self.config = config
        self.causal = causal
        policy = self.dtype_policy
        # --- layers
        self.embeddings = BertEmbeddings(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            type_vocab_size=config.type_vocab_size,
            max_position_embeddings=config.max_position_embeddings,
            dropout_rate=config.hidden_dropout_prob,
            initializer_range=config.initializer_range,
            layer_norm_eps=config.layer_norm_eps,
            name="embeddings",
            dtype=policy,
        )
        # One attribute per block (not a list): TF object-based checkpoints (tf.train.Checkpoint)
        # do not track Keras 3's list wrappers, so a list would silently drop every block.
        for i in range(config.num_hidden_layers):
            block = TransformerBlock(
                hidden_size=config.hidden_size,
                num_heads=config.num_attention_heads,
                intermediate_size=config.intermediate_size,
                hidden_act=config.hidden_act,
                hidden_dropout_rate=config.hidden_dropout_prob,
                attention_dropout_rate=config.attention_probs_dropout_prob,
                initializer_range=config.initializer_range,
                causal=causal,
                layer_norm_eps=config.layer_norm_eps,
                name=f"layer_{i}",
                dtype=policy,
            )
            setattr(self, f"layer_{i}", block)
        self.pooler = keras.layers.Dense(
            config.hidden_size,
            activation="tanh",
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=config.initializer_range),
            name="pooler",
            dtype=policy,
        )
        self.build()

    def build(self, input_shape=None):
        self.embeddings.build()
        for block in self.blocks:
            block.build()
        self.pooler.build((None, self.config.hidden_size))

    # --- forward pass
    def call(self, inputs, training=False, skip_padding=False, output_positions=None, word_table=None):
        """`skip_padding=True` runs the dense layers on the real tokens only
        (padded positions of sequence_output/encoder_outputs are then zero).
        `output_positions` int [B, P] computes the last block only at [CLS] and
        those positions: the result has `position_output` [B, P, H] instead of
        `sequence_output`, and `encoder_outputs` lacks the last block. Neither
        changes the outputs at the positions computed. `word_table` [V, H]
        (the word-embedding variable's value, in the compute dtype) is looked
        up instead of reading the variable: the pretrainer ties it to the MLM head.
        """
        for key in INPUT_NAMES:
            if key not in inputs:
                raise KeyError(f"BertEncoder inputs: missing {key!r}; expected {', '.join(INPUT_NAMES)}")
        input_ids = ops.cast(inputs["input_ids"], "int32")
        seq_length = input_ids.shape[1]  # static when known
        if seq_length is not None and seq_length > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_length} exceeds max_position_embeddings "
                f"{self.config.max_position_embeddings} of the bert_config"
            )
        if output_positions is not None and self.causal:
            raise ValueError("a causal encoder computes every position; output_positions needs a bidirectional one")
        segment_ids = ops.cast(inputs["segment_ids"], "int32")
        input_mask = ops.cast(inputs["input_mask"], "int32")
        x = self.embeddings(input_ids, segment_ids, training=training, word_table=word_table)  # [B, S, H]
        batch = ops.shape(x)[0]
        if skip_padding:
            layout = TokenLayout.real_tokens(input_mask)
        else:
            layout = TokenLayout.dense(batch, ops.shape(x)[1])
        rows = layout.to_rows(x)  # [T, H]
        blocks = self.blocks
        full_blocks = blocks if output_positions is None else blocks[:-1]
        encoder_outputs = []
        for block in full_blocks:
            rows = block(rows, input_mask, training=training, layout=layout)
            encoder_outputs.append(layout.to_grid(rows))  # unused grids are pruned from traced graphs
        if output_positions is not None:
            positions = ops.concatenate([ops.zeros((batch, 1), "int32"), ops.cast(output_positions, "int32")], 1)
            query_rows = ops.reshape(layout.rows_of(positions), ops.shape(positions))  # [B, 1 + P]
            out = blocks[-1](rows, input_mask, training=training, layout=layout, query_rows=query_rows)
            out = ops.reshape(out, (batch, ops.shape(positions)[1], self.config.hidden_size))  # [B, 1 + P, H]
            return {"pooled_output": self.pooler(out[:, 0, :]), "position_output": out[:, 1:, :],
                    "encoder_outputs": encoder_outputs}
        x = encoder_outputs[-1]  # [B, S, H]
        if self.causal:
            last = ops.maximum(ops.sum(input_mask, axis=1) - 1, 0)  # [B]: the last real position
            first_token = ops.take_along_axis(x, last[:, None, None], axis=1)[:, 0, :]  # [B, H]
        else:
            first_token = x[:, 0, :]  # [B, H]: the [CLS] position
        pooled = self.pooler(first_token)  # [B, H]
        return {"sequence_output": x, "pooled_output": pooled, "encoder_outputs": encoder_outputs}

    # --- config
    def get_config(self):
        return {"config": self.config.to_dict(), "name": self.name, "causal": self.causal}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig.from_dict(config["config"]), name=config.get("name", "bert"),
                   causal=config.get("causal", False))

    @property
    def blocks(self):
        """The Transformer blocks, first to last."""
        return [getattr(self, f"layer_{i}") for i in range(self.config.num_hidden_layers)]

    @property
    def word_embeddings(self):
        """The [V, H] word-embedding variable (tied to the masked-LM output layer)."""
        return self.embeddings.word_embeddings.embeddings


def build_encoder(config: BertConfig, **kwargs) -> BertEncoder:
    """A built `BertEncoder` for `config` (variables created, freshly initialised)."""
    return BertEncoder(config, **kwargs)


def dummy_inputs(batch_size: int = 1, seq_length: int = 2) -> dict:
    """All-zero int32 encoder inputs of shape [batch_size, seq_length] (mask all ones)."""
    zeros = ops.zeros((batch_size, seq_length), "int32")
    return {"input_ids": zeros, "input_mask": ops.ones((batch_size, seq_length), "int32"), "segment_ids": zeros}
