"""The BERT encoder: embeddings -> post-LN Transformer blocks -> tanh pooler (docs/reference.md §3).

`BertEncoder.call` is that forward pass and nothing else. Callers that read only
part of its output can ask for the same numbers with less work, by name:

  pooled_output(inputs)          [B, S] ids -> [B, H]        the last block at [CLS] only
  outputs_at(inputs, positions)  [B, S], [B, P] -> [B, H], [B, P, H]
                                 the last block at [CLS] and P positions only
  real_token_outputs(inputs)     call() with the dense layers on real tokens only
  mean_output(inputs)            [B, S] ids -> [B, H]        the last block averaged over real tokens
                                 (sentence-transformers' mean pooling; no pooler)

pooled_output, outputs_at and mean_output also skip padding unless told not to (`skip_padding=False`).
Skipping padding runs every dense layer, LayerNorm and dropout on the real
tokens' rows (`bert_tf/layers/layout.py` TokenLayout.real_tokens; about 15% of
the work on pretraining data); computing the last block at a few positions
saves most of a block when a head reads only those (the classifier reads
[CLS], the masked LM ~15% of positions). Neither changes the values that are
computed, nor the gradients (tests/test_encoder.py compares both with call()).
The real-token row count is a shape that changes from batch to batch, so
XLA-compiled training builds its models with skip_padding=False: the caller
chooses (bert_tf/runners/pretraining.py, the fine-tuning runners).

Packed rows (several sequences per row, bert_tf/data/packing.py) are the same
calls on other inputs: `sequence_ids` and `position_ids` instead of
`input_mask` (PACKED_INPUT_NAMES). embed() turns sequence_ids into a
block-diagonal [B, S, S] attention mask, which the blocks take where they take
input_mask; each sequence's outputs are its unpacked ones.

Dimensions: B batch, S sequence length (any S <= max_position_embeddings),
H hidden, P positions read, T token rows, L blocks (num_hidden_layers).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from bert_tf.configs import BertConfig
from bert_tf.layers import BertEmbeddings, TransformerBlock
from bert_tf.layers.attention import packed_attention_mask
from bert_tf.layers.layout import TokenLayout

INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")
PACKED_INPUT_NAMES = ("input_ids", "segment_ids", "sequence_ids", "position_ids")


@keras.saving.register_keras_serializable(package="bert_tf")
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

    `attention_implementation` picks how training computes attention
    (layers/attention.py ATTENTION_IMPLEMENTATIONS): "xla" (the default), or
    "cudnn", cuDNN's fused attention in an XLA-compiled step on an NVIDIA GPU
    ("cudnn_btnh": the same without the head transposes, a GPU candidate).
    The same variables and the same function: checkpoints do not record it.

    `gradient_checkpointing=True` keeps only each block's input for the backward pass, which
    computes the block again (TransformerBlock.recomputed): the same gradients for about one
    more forward pass, with the activations of one block alive at a time instead of all L.
    A training setting (TrainSettings.gradient_checkpointing turns it on for a run's model);
    inference calls are the same either way, and checkpoints do not record it.

    `plain_epilogues` (a GPU candidate) trains the blocks' bias+GELU, dropout+add and LayerNorm as plain
    ops instead of the fused custom-gradient kernels (layers/transformer.py); the same function too.
    """

    def __init__(self, config: BertConfig, name: str = "bert", causal: bool = False,
                 attention_implementation: str = "xla", gradient_checkpointing: bool = False,
                 plain_epilogues: bool = False, **kwargs):
        super().__init__(name=name, **kwargs)
        self.config = config
        self.causal = causal
        self.attention_implementation = attention_implementation
        self.gradient_checkpointing = gradient_checkpointing
        self.plain_epilogues = plain_epilogues
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
                attention_implementation=attention_implementation,
                plain_epilogues=plain_epilogues,
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
    def call(self, inputs, training=False):
        """-> {"sequence_output": [B, S, H], "pooled_output": [B, H], "encoder_outputs": [[B, S, H]] * L}."""
        x, input_mask = self.embed(inputs, training=training)  # [B, S, H]
        encoder_outputs = []
        for block in self.blocks:
            x = self.run_block(block, x, input_mask, training)  # [B, S, H]
            encoder_outputs.append(x)
        return {"sequence_output": x, "pooled_output": self.pool(x, input_mask), "encoder_outputs": encoder_outputs}

    def embed(self, inputs, training=False, word_table=None):
        """The input dict (int [B, S] each of INPUT_NAMES, or of PACKED_INPUT_NAMES for packed rows)
        -> (embeddings [B, S, H], attention mask int32: input_mask [B, S], or for packed rows
        layers.attention.packed_attention_mask [B, S, S]). `word_table` [V, H] (the word-embedding
        variable's value, in the compute dtype) is looked up instead of reading the variable:
        the pretrainer ties it to the MLM head."""
        packed = "sequence_ids" in inputs
        names = PACKED_INPUT_NAMES if packed else INPUT_NAMES
        for key in names:
            if key not in inputs:
                raise KeyError(f"BertEncoder inputs: missing {key!r}; expected {', '.join(names)}")
        if packed and self.causal:
            raise ValueError("a causal encoder reads one sequence per row; packed rows need a bidirectional one")
        input_ids = ops.cast(inputs["input_ids"], "int32")
        seq_length = input_ids.shape[1]  # static when known
        if seq_length is not None and seq_length > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_length} exceeds max_position_embeddings "
                f"{self.config.max_position_embeddings} of the bert_config"
            )
        segment_ids = ops.cast(inputs["segment_ids"], "int32")
        x = self.embeddings(input_ids, segment_ids, training=training, word_table=word_table,
                            position_ids=inputs["position_ids"] if packed else None)
        if packed:
            return x, packed_attention_mask(inputs["sequence_ids"])
        return x, ops.cast(inputs["input_mask"], "int32")

    def pool(self, sequence_output, input_mask):
        """[B, S, H] -> [B, H]: tanh(dense(x)) at [CLS]; causal, at the last real token."""
        if self.causal:
            last = ops.maximum(ops.sum(input_mask, axis=1) - 1, 0)  # [B]: the last real position
            first_token = ops.take_along_axis(sequence_output, last[:, None, None], axis=1)[:, 0, :]
        else:
            first_token = sequence_output[:, 0, :]  # the [CLS] position
        return self.pooler(first_token)

    # --- the same numbers with less work (see the module docstring)
    def pooled_output(self, inputs, training=False, skip_padding=True):
        """[B, S] inputs -> pooled_output [B, H], the last block computed at [CLS] only (a classifier
        reads nothing else). A causal encoder pools its last token: call() computes everything."""
        if self.causal:
            return self(inputs, training=training)["pooled_output"]
        no_positions = ops.zeros((ops.shape(inputs["input_ids"])[0], 0), "int32")
        return self.outputs_at(inputs, no_positions, training=training, skip_padding=skip_padding)["pooled_output"]

    def outputs_at(self, inputs, positions, training=False, skip_padding=True, word_table=None):
        """[B, S] inputs, positions int [B, P] -> {"pooled_output": [B, H], "position_output": [B, P, H]},
        call()'s pooled_output and sequence_output at `positions`, with the last block computed only
        at [CLS] and those positions. `word_table` as in embed()."""
        if self.causal:
            raise ValueError("a causal encoder computes every position; outputs_at needs a bidirectional one")
        x, input_mask = self.embed(inputs, training=training, word_table=word_table)  # [B, S, H]
        batch = ops.shape(x)[0]
        layout = (TokenLayout.real_tokens(token_mask(input_mask)) if skip_padding
                  else TokenLayout.dense(batch, ops.shape(x)[1]))
        rows = layout.to_rows(x)  # [T, H]
        *blocks, last_block = self.blocks
        for block in blocks:
            rows = self.run_block(block, rows, input_mask, training, layout=layout)  # [T, H]
        positions = ops.concatenate([ops.zeros((batch, 1), "int32"), ops.cast(positions, "int32")], 1)  # [B, 1 + P]
        query_rows = ops.reshape(layout.rows_of(positions), ops.shape(positions))  # [B, 1 + P]
        if len(input_mask.shape) == 3:  # packed: the mask rows of the queries, [B, 1 + P, S]
            input_mask = tf.gather(input_mask, positions, batch_dims=1)
        out = self.run_block(last_block, rows, input_mask, training, layout=layout,
                             query_rows=query_rows)  # [B * (1 + P), H]
        out = ops.reshape(out, (batch, ops.shape(positions)[1], self.config.hidden_size))  # [B, 1 + P, H]
        return {"pooled_output": self.pooler(out[:, 0, :]), "position_output": out[:, 1:, :]}

    def mean_output(self, inputs, training=False, skip_padding=True, slots=None):
        """[B, S] inputs -> [B, H]: the last block's output averaged over each input's real tokens, in float32
        and then the compute dtype (the mean pooling sentence-transformers models are trained with; the
        pooler is not used). Packed rows (sequence_ids) with `slots` K -> [B, K, H], each sequence's own
        mean (zeros for an empty slot)."""
        x, attention = self.embed(inputs, training=training)  # [B, S, H]
        layout = (TokenLayout.real_tokens(token_mask(attention)) if skip_padding
                  else TokenLayout.dense(ops.shape(x)[0], ops.shape(x)[1]))
        rows = layout.to_rows(x)  # [T, H]
        for block in self.blocks:
            rows = self.run_block(block, rows, attention, training, layout=layout)  # [T, H]
        x = ops.cast(layout.to_grid(rows), "float32")  # [B, S, H]
        if slots is None:
            weights = ops.cast(inputs["input_mask"], "float32")[:, :, None]  # [B, S, 1]
            mean = ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
        else:  # sequence k of a row is sequence_ids == k (1..K); padding is 0, whose one_hot(-1) is all zeros
            member = ops.one_hot(ops.cast(inputs["sequence_ids"], "int32") - 1, slots, dtype="float32")  # [B, S, K]
            mean = ops.einsum("bsk,bsh->bkh", member, x) / ops.maximum(ops.sum(member, axis=1), 1.0)[:, :, None]
        return ops.cast(mean, self.compute_dtype)

    def real_token_outputs(self, inputs, training=False):
        """call() with the dense layers on real tokens only: the same outputs at real positions and
        the same pooled_output; sequence_output and encoder_outputs are zero at padded positions."""
        x, input_mask = self.embed(inputs, training=training)  # [B, S, H]
        layout = TokenLayout.real_tokens(token_mask(input_mask))
        rows = layout.to_rows(x)  # [T, H]
        encoder_outputs = []
        for block in self.blocks:
            rows = self.run_block(block, rows, input_mask, training, layout=layout)  # [T, H]
            encoder_outputs.append(layout.to_grid(rows))  # [B, S, H]
        x = encoder_outputs[-1]
        return {"sequence_output": x, "pooled_output": self.pool(x, input_mask), "encoder_outputs": encoder_outputs}

    # --- config
    def get_config(self):
        return {"config": self.config.to_dict(), "name": self.name, "causal": self.causal,
                "attention_implementation": self.attention_implementation,
                "gradient_checkpointing": self.gradient_checkpointing, "plain_epilogues": self.plain_epilogues,
                "dtype": self.dtype_policy.name}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig.from_dict(config["config"]), name=config.get("name", "bert"),
                   causal=config.get("causal", False),
                   attention_implementation=config.get("attention_implementation", "xla"),
                   gradient_checkpointing=config.get("gradient_checkpointing", False),
                   plain_epilogues=config.get("plain_epilogues", False), dtype=config.get("dtype"))


    def run_block(self, block, x, input_mask, training, **kwargs):
        """block(x, input_mask, ...); in training with gradient_checkpointing, recomputed in the backward pass."""
        if self.gradient_checkpointing and training:
            return block.recomputed(x, input_mask, training=training, **kwargs)
        return block(x, input_mask, training=training, **kwargs)

    @property
    def blocks(self):
        """The Transformer blocks, first to last."""
        return [getattr(self, f"layer_{i}") for i in range(self.config.num_hidden_layers)]

    @property
    def word_embeddings(self):
        """The [V, H] word-embedding variable (tied to the masked-LM output layer)."""
        return self.embeddings.word_embeddings.embeddings


def token_mask(attention_mask):
    """embed()'s attention mask -> int [B, S], 1 at real tokens: input_mask [B, S] itself; of a packed
    [B, S, S] mask its diagonal (a token attends to itself iff it is real)."""
    if len(attention_mask.shape) == 2:
        return attention_mask
    return ops.diagonal(attention_mask, axis1=1, axis2=2)


def build_encoder(config: BertConfig, **kwargs) -> BertEncoder:
    """A built `BertEncoder` for `config` (variables created, freshly initialised)."""
    return BertEncoder(config, **kwargs)


def dummy_inputs(batch_size: int = 1, seq_length: int = 2) -> dict:
    """All-zero int32 encoder inputs of shape [batch_size, seq_length] (mask all ones)."""
    zeros = ops.zeros((batch_size, seq_length), "int32")
    return {"input_ids": zeros, "input_mask": ops.ones((batch_size, seq_length), "int32"), "segment_ids": zeros}
