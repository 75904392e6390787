"""Per-layer encoder outputs combined into one vector per token: the rows of the paper's Table 7
(§5.3, the feature-based approach).

One chosen layer ("layer:-2"), the sum or the concatenation of the last k ("sum_last:4",
"concat_last:4", the paper's best for NER), or a weighted sum of all layers ("scalar_mix", ELMo's
scalar mix: softmax weights and a scale, learned by a feature-based model such as
bert_tf.models.feature_tagger, uniform or given when extracting: bert_tf.feature_extraction).

Dimensions: B batch, S max_seq_length, H hidden, L layers.
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence

import keras
from keras import ops

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
