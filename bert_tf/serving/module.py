"""What every serving module shares: tokenizer + model + packing, saved as one tf.Module.

A serving module is the `tf.Module` that `bert_tf.export` saves. Each task type
has its own (`encoder.py`, `classifier.py`, `span.py`, `multiple_choice.py`,
`tagging.py`), with the signatures
  serving_default  raw strings, tokenized in the graph (each module's inputs);
  serve_ids        int32 [B, S] (multiple choice: [B, C, S]) input_word_ids,
                   input_mask, input_type_ids, the TF-Hub names (docs/reference.md §8);
  preprocess       the raw-string inputs -> those three int32 tensors.
Every module is built the same way, `Module(model, tokenizer, options,
metadata_file, kept_variables)`, so the export picks one from a table; what a
task type needs from the options it checks in `check_options` and records in
`metadata_entries`.

Dimensions: B batch, C choices, S max_seq_length, H hidden, L labels.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import tensorflow as tf

from bert_tf.errors import ExportError
from bert_tf.serving.tokenizer import InGraphTokenizer, pack_pair
from bert_tf.tasks.squad import DEFAULT_MAX_ANSWER_LENGTH, DEFAULT_MAX_QUERY_LENGTH

HUB_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")


def used_length(input_mask: tf.Tensor) -> tf.Tensor:
    """int [B, S] or [B, C, S] mask -> int32 scalar: 1 + the last position any row has a 1 at (at least 1)."""
    mask = tf.reshape(input_mask, [-1, tf.shape(input_mask)[-1]])  # [rows, S]
    used = tf.reduce_any(tf.not_equal(mask, 0), axis=0)  # [S]
    positions = tf.range(1, tf.shape(mask)[1] + 1)
    return tf.maximum(tf.reduce_max(tf.where(used, positions, 0)), tf.minimum(1, tf.shape(mask)[1]))


def pad_positions(x: tf.Tensor, length) -> tf.Tensor:
    """[B, s, ...] -> [B, length, ...] with zeros after position s (the positions `_model` did not compute)."""
    pad = tf.reshape(length - tf.shape(x)[1], [1, 1])
    paddings = tf.concat([[[0, 0]], tf.concat([[[0]], pad], axis=1), tf.zeros([tf.rank(x) - 2, 2], tf.int32)], 0)
    return tf.pad(x, paddings)


ServingOptionsError = ExportError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """What the serving graph needs besides the model and the tokenizer.

    label_list: classification and tagging; num_choices: multiple choice;
    max_query_length, max_answer_length: span (the original run_squad.py's defaults).
    """

    max_seq_length: int
    label_list: Optional[Sequence[str]] = None
    num_choices: Optional[int] = None
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH
    max_answer_length: int = DEFAULT_MAX_ANSWER_LENGTH


def string_spec(name, shape=(None,)):
    return tf.TensorSpec(list(shape), tf.string, name=name)


def ids_specs(rank=2):
    return {name: tf.TensorSpec([None] * rank, tf.int32, name=name) for name in HUB_INPUTS}


def our_names(hub: dict) -> dict:
    """TF-Hub input names -> the encoder's (docs/reference.md §8 and docs/design.md's one vocabulary)."""
    return {"input_ids": hub["input_word_ids"], "input_mask": hub["input_mask"], "segment_ids": hub["input_type_ids"]}


class ServingModule(tf.Module):
    """Tokenizer + model + packing; subclasses add the task outputs and signatures.

    kept_variables=None (float32): the module tracks the model and the serving functions call
    it. A list (int8, see bert_tf.serving.quantize): only those variables are saved (not the
    float kernels the int8 constants replace), and every signature calls one traced forward
    pass, so the int8 constants are stored once.
    """

    ids_rank = 2  # of the model's int32 inputs: [B, S] (multiple choice: [B, C, S])
    serves_encoder = False  # True: the module serves the encoder of the model it is given

    def __init__(self, model, tokenizer: InGraphTokenizer, options: ServingOptions, metadata_file: str,
                 kept_variables=None):
        super().__init__()
        if kept_variables is None:
            self.model = model
            self._forward = None
        else:
            # Named by their Keras paths (layer_0.attention_LayerNorm.gamma, ...).
            named = {}
            for v in kept_variables:
                name = getattr(v, "path", v.name).replace("/", ".").replace(":", "_")
                named[name if name not in named else f"{name}_{len(named)}"] = v
            self.float_variables = named
            spec = {name: tf.TensorSpec([None] * self.ids_rank, tf.int32)
                    for name in ("input_ids", "input_mask", "segment_ids")}
            self._forward = tf.function(lambda features: model(features, training=False), input_signature=[spec],
                                        autograph=False)
        self.tokenizer = tokenizer
        self.max_seq_length = int(options.max_seq_length)
        self.metadata = tf.saved_model.Asset(metadata_file)
        self._cls_id = tokenizer.lookup("[CLS]")
        self._sep_id = tokenizer.lookup("[SEP]")

    @classmethod
    def check_options(cls, options: ServingOptions) -> None:
        """Raises ExportError when `options` lack what this task type needs."""

    @classmethod
    def metadata_entries(cls, options: ServingOptions) -> dict:
        """This task type's entries in the export's metadata (assets/bert_tf_export.json)."""
        return {}

    def _model(self, features):
        """The model on `features` (our names, int [B, S] or [B, C, S]) cut to the positions the batch uses.

        Positions after the last one any row of the batch has in its input_mask are padding everywhere;
        no real position attends to them (their attention bias is -10000: exp() of it is 0 in float32),
        so the model is run on the used prefix only (`used_length`): the same values at every position
        it computes, to float32 rounding, for a fraction of the work when texts are shorter than
        max_seq_length. Outputs per position come back `used_length` long: `pad_positions` restores S.
        int8: each layer's activation range is then taken over the used positions only (see quantize.py).
        """
        length = used_length(features["input_mask"])
        features = {k: tf.cast(v[..., :length], tf.int32) for k, v in features.items()}
        if self._forward is None:
            return self.model(features, training=False)
        return self._forward(features)

    def _pack(self, text_a, text_b):
        """string [N], [N] -> int32 [N, S] TF-Hub inputs; text_b "" means one segment."""
        # One tokenizer pass over A and B together (half the graph, one op launch each).
        ids = self.tokenizer.tokenize(tf.concat([text_a, text_b], axis=0))  # [2N, (T)]
        n = tf.shape(text_a)[0]
        ids_a, ids_b = ids[:n], ids[n:]
        return pack_pair(ids_a, ids_b, self.max_seq_length, self._cls_id, self._sep_id)

    def signatures(self) -> dict:
        raise NotImplementedError
