"""Activations by the names `bert_config.json` uses (`hidden_act`)."""

import math

from keras import ops

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
# The cubic coefficient of the tanh approximation (Hendrycks & Gimpel, 2016).
_GELU_CUBIC = 0.044715


def gelu(x):
    """The tanh approximation of GELU the original uses for "gelu" (REFERENCE.md §3).

    The exact erf GELU differs in the 4th decimal and breaks parity with
    original checkpoints, so "gelu" means this formula here.
    """
    return 0.5 * x * (1.0 + ops.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * ops.power(x, 3))))


def linear(x):
    return x


_ACTIVATIONS = {"gelu": gelu, "relu": ops.relu, "tanh": ops.tanh, "linear": linear}


def get_activation(name: str):
    """The activation function for a `hidden_act` name (gelu, relu, tanh, linear)."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; expected one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]
