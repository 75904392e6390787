"""Contextual token features from a pretrained encoder, the paper's feature-based approach (§5.3).

Reads the original `extract_features.py` input (one example per line, ` ||| `
between the two segments of a pair) and writes its JSONL output:
  {"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}, ...]}, ...]}
with values rounded to 6 decimals. Layer index -1 is the last Transformer block.

Dimensions: B batch, S max_seq_length, H hidden.
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterable, List, Sequence, Tuple

import numpy as np

PAIR_SEPARATOR = " ||| "
# The original's rule: greedy, so the last " ||| " of a line splits the pair.
_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")
DEFAULT_LAYERS = (-1, -2, -3, -4)
VALUE_DECIMALS = 6


def read_examples(input_file: str) -> List[Tuple[int, str, str | None]]:
    """(line index, text_a, text_b or None) for every line of `input_file`."""
    import tensorflow as tf

    from bert_tf.tokenization import convert_to_unicode

    if not tf.io.gfile.exists(input_file):
        raise FileNotFoundError(f"{input_file}: input file not found")
    examples = []
    with tf.io.gfile.GFile(input_file, "r") as f:
        for index, line in enumerate(f):
            line = convert_to_unicode(line).strip()
            match = _PAIR.match(line)
            examples.append((index, match.group(1), match.group(2)) if match else (index, line, None))
    return examples


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


def extract_features(
    encoder,
    tokenizer,
    examples: Sequence[Tuple[int, str, str | None]],
    output_file: str,
    layers: Iterable[int] = DEFAULT_LAYERS,
    max_seq_length: int = 128,
    batch_size: int = 32,
) -> int:
    """Runs `encoder` over `examples` and writes the original JSONL to `output_file`; returns the line count."""
    import tensorflow as tf

    layers = list(layers)
    num_layers = encoder.config.num_hidden_layers
    for layer in layers:
        if not -num_layers <= layer < num_layers:
            raise ValueError(f"layers: {layer} is out of range for a {num_layers}-layer model")

    @tf.function
    def run(batch):
        outputs = encoder(batch, training=False)["encoder_outputs"]
        return [tf.cast(outputs[i], tf.float32) for i in layers]  # each [B, S, H]

    tmp = f"{output_file}.tmp-{os.getpid()}"
    count = 0
    with tf.io.gfile.GFile(tmp, "w") as out:
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            encoded = [encode_example(tokenizer, a, b, max_seq_length) for _, a, b in chunk]
            batch = {
                "input_ids": np.array([e[1] for e in encoded], np.int32),  # [B, S]
                "input_mask": np.array([e[2] for e in encoded], np.int32),
                "segment_ids": np.array([e[3] for e in encoded], np.int32),
            }
            values = [v.numpy() for v in run(batch)]
            for row, ((index, _, _), (tokens, *_)) in enumerate(zip(chunk, encoded, strict=True)):
                features = [
                    {
                        "token": token,
                        "layers": [
                            {"index": layer, "values": [round(float(x), VALUE_DECIMALS) for x in values[k][row, t]]}
                            for k, layer in enumerate(layers)
                        ],
                    }
                    for t, token in enumerate(tokens)
                ]
                out.write(json.dumps({"linex_index": index, "features": features}) + "\n")
                count += 1
    tf.io.gfile.rename(tmp, output_file, overwrite=True)
    return count
