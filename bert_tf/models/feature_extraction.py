"""Contextual token features from a pretrained encoder, the paper's feature-based approach (§5.3).

Reads the original `extract_features.py` input (one example per line, ` ||| `
between the two segments of a pair) and writes its JSONL output:
  {"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}, ...]}, ...]}
with values rounded to 6 decimals. Layer index -1 is the last Transformer block.

Layers can also be combined into one vector per token (`LayerCombination`, the
rows of the paper's Table 7): one chosen layer ("layer:-2"), the sum or the
concatenation of the last k ("sum_last:4", "concat_last:4", the paper's best for
NER), or a weighted sum of all layers ("scalar_mix", ELMo's scalar mix: softmax
weights and a scale, learned by a feature-based model such as
bert_tf.models.feature_tagger, uniform or given when extracting). Combined
output has one entry per token: {"index": "<spec>", "values": [...]}.

Dimensions: B batch, S max_seq_length, H hidden.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Iterable, List, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from bert_tf import fileio

PAIR_SEPARATOR = " ||| "
# The original's rule: greedy, so the last " ||| " of a line splits the pair.
_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")
DEFAULT_LAYERS = (-1, -2, -3, -4)
VALUE_DECIMALS = 6


COMBINATION_KINDS = ("layer", "sum_last", "concat_last", "scalar_mix")


@dataclasses.dataclass(frozen=True)
class LayerCombination:
    """How per-layer features [B, S, H] become one [B, S, H'] tensor.

    kind "layer": encoder layer `k` (negative from the end); "sum_last" /
    "concat_last": the last `k` layers summed (H' = H) or concatenated, last
    layer first (H' = k * H); "scalar_mix": sum_j w_j * layer_j over all layers.
    """

    kind: str
    k: int = 0

    @property
    def spec(self) -> str:
        return self.kind if self.kind == "scalar_mix" else f"{self.kind}:{self.k}"

    def layer_indexes(self, num_layers: int) -> List[int]:
        """The (non-negative) encoder layers this combination reads, in the order it uses them."""
        if self.kind == "layer":
            if not -num_layers <= self.k < num_layers:
                raise ValueError(f"layer combination {self.spec}: no layer {self.k} in a {num_layers}-layer model")
            return [self.k % num_layers]
        if self.kind == "scalar_mix":
            return list(range(num_layers))
        if self.k > num_layers:
            raise ValueError(f"layer combination {self.spec}: the model has only {num_layers} layers")
        return [num_layers - 1 - i for i in range(self.k)]  # last layer first

    def output_size(self, hidden_size: int) -> int:
        return hidden_size * self.k if self.kind == "concat_last" else hidden_size

    def fit(self, num_layers: int) -> "LayerCombination":
        """The same combination over at most `num_layers` layers (concat_last:4 of a 2-layer model: its 2)."""
        if self.kind in ("sum_last", "concat_last") and self.k > num_layers:
            return dataclasses.replace(self, k=num_layers)
        return self


def parse_layer_combination(spec: str) -> LayerCombination:
    """'layer:-2' | 'sum_last:4' | 'concat_last:4' | 'scalar_mix' -> LayerCombination (ValueError otherwise)."""
    kind, _, arg = spec.strip().partition(":")
    expected = "expected layer:<index>, sum_last:<k>, concat_last:<k> or scalar_mix"
    if kind not in COMBINATION_KINDS:
        raise ValueError(f"layer combination {spec!r}: {expected}")
    if kind == "scalar_mix":
        if arg:
            raise ValueError(f"layer combination {spec!r}: scalar_mix takes no argument")
        return LayerCombination(kind)
    try:
        k = int(arg)
    except ValueError:
        raise ValueError(f"layer combination {spec!r}: {expected}") from None
    if kind != "layer" and k < 1:
        raise ValueError(f"layer combination {spec!r}: k must be >= 1")
    return LayerCombination(kind, k)


def combine_layers(encoder_outputs: Sequence, combination: LayerCombination, mix_weights=None, mix_scale=None):
    """encoder_outputs: list of L tensors [B, S, H] -> float32 [B, S, H'] (H' = combination.output_size(H)).

    scalar_mix: `mix_weights` float [L] (already normalised; None = uniform 1/L) and
    an optional scalar `mix_scale` (ELMo's gamma).
    """
    layers = [ops.cast(encoder_outputs[i], "float32") for i in combination.layer_indexes(len(encoder_outputs))]
    if combination.kind == "layer":
        return layers[0]
    if combination.kind == "sum_last":
        return ops.sum(ops.stack(layers, axis=0), axis=0)  # [B, S, H]
    if combination.kind == "concat_last":
        return ops.concatenate(layers, axis=-1)  # [B, S, k * H]
    stacked = ops.stack(layers, axis=-1)  # [B, S, H, L]
    if mix_weights is None:
        mix_weights = ops.ones((len(layers),), "float32") / len(layers)
    mixed = ops.sum(stacked * ops.cast(mix_weights, "float32"), axis=-1)  # [B, S, H]
    return mixed if mix_scale is None else mixed * mix_scale


class ScalarMix(keras.layers.Layer):
    """ELMo's learned scalar mix (Peters et al. 2018, eq. 1): gamma * sum_j softmax(s)_j * layer_j.

    Call on a list of L tensors [B, S, H] -> float32 [B, S, H].
    """

    def __init__(self, num_layers: int, name: str = "scalar_mix", **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(name=name, **kwargs)
        self.num_layers = num_layers

    def build(self, input_shape=None):
        self.scalars = self.add_weight(name="scalars", shape=(self.num_layers,), initializer="zeros")
        self.gamma = self.add_weight(name="gamma", shape=(), initializer="ones")

    def call(self, encoder_outputs):
        weights = ops.softmax(self.scalars)  # [L]
        return combine_layers(encoder_outputs, LayerCombination("scalar_mix"), weights, self.gamma)

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers)
        return config


def read_examples(input_file: str) -> List[Tuple[int, str, str | None]]:
    """(line index, text_a, text_b or None) for every line of `input_file`."""
    return list(iter_examples(input_file))


def iter_examples(input_file: str) -> Iterable[Tuple[int, str, str | None]]:
    """read_examples, streamed (the Beam pipeline reads files of any size this way)."""
    import tensorflow as tf

    from bert_tf.tokenization import convert_to_unicode

    if not tf.io.gfile.exists(input_file):
        raise FileNotFoundError(f"{input_file}: input file not found")
    with tf.io.gfile.GFile(input_file, "r") as f:
        for index, line in enumerate(f):
            line = convert_to_unicode(line).strip()
            match = _PAIR.match(line)
            yield (index, match.group(1), match.group(2)) if match else (index, line, None)


def _truncate_pair(a: list, b: list, max_length: int) -> None:
    """Pops from the longer list until both fit (the original's rule)."""
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()


def encode_example(tokenizer, text_a: str, text_b: str | None, max_seq_length: int):
    """-> (tokens, input_ids [S], input_mask [S], segment_ids [S]) as the original builds them."""
    a = tokenizer.tokenize(text_a)
    b = tokenizer.tokenize(text_b) if text_b is not None else None
    if b is not None:
        _truncate_pair(a, b, max_seq_length - 3)  # [CLS] a [SEP] b [SEP]
    else:
        a = a[: max_seq_length - 2]  # [CLS] a [SEP]
    tokens = ["[CLS]", *a, "[SEP]"]
    segments = [0] * len(tokens)
    if b:
        tokens += [*b, "[SEP]"]
        segments += [1] * (len(b) + 1)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    pad = max_seq_length - len(ids)
    return tokens, ids + [0] * pad, [1] * len(ids) + [0] * pad, segments + [0] * pad


class FeatureExtractor:
    """An encoder and its tokenizer that turn examples into the original's JSONL lines.

    With `combination` (then `layers` is ignored) each token has one entry, the
    combined vector, whose "index" is the combination's spec; `mix_weights`
    (one per layer, used as given) weight a scalar_mix, else 1/L each.
    """

    def __init__(self, encoder, tokenizer, layers: Iterable[int] = DEFAULT_LAYERS, max_seq_length: int = 128,
                 combination: Optional[LayerCombination] = None, mix_weights: Optional[Sequence[float]] = None):
        import tensorflow as tf

        layers = list(layers)
        num_layers = encoder.config.num_hidden_layers
        for layer in layers:
            if not -num_layers <= layer < num_layers:
                raise ValueError(f"layers: {layer} is out of range for a {num_layers}-layer model")
        weights = None
        if combination is not None:
            combination.layer_indexes(num_layers)  # a one-line error before any work
            if mix_weights is not None and len(mix_weights) != num_layers:
                raise ValueError(f"mix weights: {len(mix_weights)} given for a {num_layers}-layer model")
            layers = [combination.spec]
            weights = None if mix_weights is None else tf.constant(list(mix_weights), tf.float32)
        self.tokenizer, self.layers, self.max_seq_length = tokenizer, layers, max_seq_length

        @tf.function
        def run(batch):
            outputs = encoder(batch, training=False)["encoder_outputs"]
            if combination is not None:
                return [combine_layers(outputs, combination, weights)]  # [B, S, H']
            return [tf.cast(outputs[i], tf.float32) for i in layers]  # each [B, S, H]

        self._run = run

    def lines(self, examples: Sequence[Tuple[int, str, str | None]]) -> List[str]:
        """One JSON line per example (one batch: all of them in one call)."""
        encoded = [encode_example(self.tokenizer, a, b, self.max_seq_length) for _, a, b in examples]
        batch = {
            "input_ids": np.array([e[1] for e in encoded], np.int32),  # [B, S]
            "input_mask": np.array([e[2] for e in encoded], np.int32),
            "segment_ids": np.array([e[3] for e in encoded], np.int32),
        }
        values = [v.numpy() for v in self._run(batch)]
        out = []
        for row, ((index, _, _), (tokens, *_)) in enumerate(zip(examples, encoded, strict=True)):
            features = [
                {
                    "token": token,
                    "layers": [
                        {"index": layer, "values": [round(float(x), VALUE_DECIMALS) for x in values[k][row, t]]}
                        for k, layer in enumerate(self.layers)
                    ],
                }
                for t, token in enumerate(tokens)
            ]
            out.append(json.dumps({"linex_index": index, "features": features}))
        return out

    def batched_lines(self, examples: Sequence[Tuple[int, str, str | None]], batch_size: int) -> Iterable[str]:
        for start in range(0, len(examples), batch_size):
            yield from self.lines(examples[start : start + batch_size])


def extract_features(
    encoder,
    tokenizer,
    examples: Sequence[Tuple[int, str, str | None]],
    output_file: str,
    layers: Iterable[int] = DEFAULT_LAYERS,
    max_seq_length: int = 128,
    batch_size: int = 32,
    combination: Optional[LayerCombination] = None,
    mix_weights: Optional[Sequence[float]] = None,
) -> int:
    """Runs `encoder` over `examples` and writes the original JSONL to `output_file`; returns the line count."""
    extractor = FeatureExtractor(encoder, tokenizer, layers, max_seq_length, combination, mix_weights)
    return write_features(extractor, examples, output_file, batch_size)


def write_features(extractor: FeatureExtractor, examples: Sequence[Tuple[int, str, str | None]], output_file: str,
                   batch_size: int = 32) -> int:
    """The extractor's lines for `examples` in `output_file` (through a temporary name); returns the line count."""
    import tensorflow as tf

    fileio.make_parent_dirs(output_file)
    tmp = f"{output_file}.tmp-{os.getpid()}"
    count = 0
    with tf.io.gfile.GFile(tmp, "w") as out:
        for line in extractor.batched_lines(examples, batch_size):
            out.write(line + "\n")
            count += 1
    tf.io.gfile.rename(tmp, output_file, overwrite=True)
    return count


@dataclasses.dataclass(frozen=True)
class ExtractorSettings:
    """extract_features.py's model flags: everything needed to build a FeatureExtractor on any machine."""

    init_checkpoint: str
    bert_config_file: Optional[str] = None
    vocab_file: Optional[str] = None
    do_lower_case: bool = True
    max_seq_length: int = 128
    layers: Tuple[int, ...] = DEFAULT_LAYERS
    combination: Optional[str] = None  # a layer-combination spec
    mix_weights: Optional[Tuple[float, ...]] = None

    def build(self) -> FeatureExtractor:
        """Loads the checkpoint (TF1, ours or Hugging Face) into an encoder; one-line errors as extract_features.py."""
        from bert_tf import checkpoints
        from bert_tf.configs import ConfigError
        from bert_tf.finetuning import resolve_pretrained
        from bert_tf.tokenization import FullTokenizer

        # Any checkpoint kind, with its config and vocab found beside it, as for fine-tuning.
        pretrained = resolve_pretrained(self.init_checkpoint, self.bert_config_file, self.vocab_file)
        config = pretrained.config
        if self.max_seq_length > config.max_position_embeddings:
            raise ConfigError(
                f"--max_seq_length={self.max_seq_length} exceeds max_position_embeddings "
                f"{config.max_position_embeddings} of the bert_config"
            )
        tokenizer = FullTokenizer(pretrained.vocab_file, do_lower_case=self.do_lower_case)
        encoder = pretrained.build_encoder()  # left to right where the checkpoint's folder records it
        checkpoints.load_pretrained(encoder, pretrained.init_checkpoint, pretrained.fmt)
        combination = parse_layer_combination(self.combination) if self.combination else None
        return FeatureExtractor(encoder, tokenizer, self.layers, self.max_seq_length, combination,
                                None if self.mix_weights is None else list(self.mix_weights))
