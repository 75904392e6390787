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
bert_tf.models.feature_tagger, uniform or given when extracting: bert_tf.models.layer_combination). Combined
output has one entry per token: {"index": "<spec>", "values": [...]}.

Dimensions: B batch, S max_seq_length, H hidden.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from bert_tf import fileio
from bert_tf.checkpoints import load_pretrained
from bert_tf.errors import ConfigError
from bert_tf.models.layer_combination import LayerCombination, combine_layers, parse_layer_combination
from bert_tf.pretrained import resolve_pretrained
from bert_tf.tokenization import FullTokenizer, convert_to_unicode

PAIR_SEPARATOR = " ||| "
# The original's rule: greedy, so the last " ||| " of a line splits the pair.
_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")
DEFAULT_LAYERS = (-1, -2, -3, -4)
VALUE_DECIMALS = 6


def read_examples(input_file: str) -> List[Tuple[int, str, str | None]]:
    """(line index, text_a, text_b or None) for every line of `input_file`."""
    return list(iter_examples(input_file))


def iter_examples(input_file: str) -> Iterable[Tuple[int, str, str | None]]:
    """read_examples, streamed (the Beam pipeline reads files of any size this way)."""
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
        load_pretrained(encoder, pretrained.init_checkpoint, pretrained.fmt)
        combination = parse_layer_combination(self.combination) if self.combination else None
        return FeatureExtractor(encoder, tokenizer, self.layers, self.max_seq_length, combination,
                                None if self.mix_weights is None else list(self.mix_weights))
