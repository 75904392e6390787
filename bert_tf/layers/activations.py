"""Activations by the names `bert_config.json` uses (`hidden_act`)."""

import math

import keras
import tensorflow as tf
from keras import ops

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
# The cubic coefficient of the tanh approximation (Hendrycks & Gimpel, 2016).
_GELU_CUBIC = 0.044715


def _gelu_and_tanh(x):
    t = ops.tanh(x * (_SQRT_2_OVER_PI + _SQRT_2_OVER_PI * _GELU_CUBIC * x * x))
    return 0.5 * x * (1.0 + t), t


def _gelu_backward(x, t, dy):
    # d/dx 0.5 x (1 + tanh(u)), u = c (x + a x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)
    slope = _SQRT_2_OVER_PI + 3.0 * _SQRT_2_OVER_PI * _GELU_CUBIC * x * x
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope)


_gelu_grad = tf.function(_gelu_backward, jit_compile=True, autograph=False)


@tf.function(jit_compile=True, autograph=False)
def _bias_gelu_forward(mm, bias):
    return _gelu_and_tanh(mm + bias)


@tf.function(jit_compile=True, autograph=False)
def _bias_gelu_grad(mm, bias, t, dy):
    d_x = _gelu_backward(mm + bias, t, dy)
    d_bias = tf.reduce_sum(tf.reshape(tf.cast(d_x, tf.float32), (-1, tf.shape(bias)[0])), axis=0)
    return d_x, tf.cast(d_bias, bias.dtype)


@tf.custom_gradient
def bias_gelu(mm, bias):
    """gelu(mm + bias) for a matmul result mm [..., N] and bias [N], forward and backward each one
    XLA kernel (the backward also reduces the bias gradient). For training: inference keeps plain ops."""
    y, t = _bias_gelu_forward(mm, bias)
    return y, lambda dy: _bias_gelu_grad(mm, bias, t, dy)


def _gelu_exact_and_cdf(x):
    cdf = 0.5 * (1.0 + tf.math.erf(x * _SQRT_HALF))
    return x * cdf, cdf


@tf.function(jit_compile=True, autograph=False)
def _bias_gelu_exact_forward(mm, bias):
    return _gelu_exact_and_cdf(mm + bias)


@tf.function(jit_compile=True, autograph=False)
def _bias_gelu_exact_grad(mm, bias, cdf, dy):
    x = mm + bias
    d_x = dy * (cdf + x * tf.exp(-0.5 * x * x) * _INV_SQRT_2PI)  # d/dx x Phi(x) = Phi(x) + x phi(x)
    d_bias = tf.reduce_sum(tf.reshape(tf.cast(d_x, tf.float32), (-1, tf.shape(bias)[0])), axis=0)
    return d_x, tf.cast(d_bias, bias.dtype)


@tf.custom_gradient
def bias_gelu_exact(mm, bias):
    """gelu_exact(mm + bias), as `bias_gelu` for the erf form: one XLA kernel each way, for training."""
    y, cdf = _bias_gelu_exact_forward(mm, bias)
    return y, lambda dy: _bias_gelu_exact_grad(mm, bias, cdf, dy)


@tf.custom_gradient
def _gelu_fused_grad(x):
    y, t = _gelu_and_tanh(x)
    return y, lambda dy: _gelu_grad(x, t, dy)


def gelu(x):
    """The tanh approximation of GELU the original BERT code uses for "gelu".

    The exact erf GELU (`gelu_exact`, Hugging Face's "gelu") differs in the 4th
    decimal and breaks parity with original checkpoints, so "gelu" means this
    formula here. The forward pass
    is plain TensorFlow ops (SavedModels need no XLA); the gradient is one
    XLA-fused kernel that reuses the forward tanh (on CPU it was eight passes
    over the [tokens, 4H] activations, ~9% of a BERT-small training step).
    """
    return _gelu_fused_grad(x)


def gelu_exact(x):
    """The exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))): `hidden_act` "gelu_exact", what a
    Hugging Face config.json calls "gelu". Plain ops (the `Dense` below fuses it in training)."""
    return 0.5 * x * (1.0 + ops.erf(x * _SQRT_HALF))


def linear(x):
    return x


def plain_gelu(x):
    """`gelu`'s function as plain ops with TensorFlow's own gradient (no custom gradient, one user): the
    pattern XLA's GPU GEMM rewriter can fuse into cuBLASLt's bias+GELU epilogue (Dense.plain_call)."""
    return _gelu_and_tanh(x)[0]


class Dense(keras.layers.Dense):
    """keras.layers.Dense (same variables and config); in training, a "gelu" or "gelu_exact" layer
    adds its bias and applies its own GELU in one XLA kernel (plain TensorFlow ops took seven passes
    over the [tokens, intermediate] activations, ~2% of a BERT-base step on CPU; the erf form's
    Dense step was 25% slower unfused at MiniLM size). Other activations run as plain ops."""

    def call(self, inputs, training=None):
        fused = _BIAS_FUSED.get(self.activation) if training and self.bias is not None else None
        if fused is not None:
            mm = ops.matmul(inputs, self.kernel)
            return fused(mm, ops.cast(self.bias, mm.dtype))
        return super().call(inputs, training=training)

    def plain_call(self, inputs):
        """activation(inputs @ kernel + bias) as plain ops with TensorFlow's own gradients (the plain
        epilogue, TransformerBlock plain_epilogues): the same function as call, no fused kernel."""
        activation = _PLAIN.get(self.activation, self.activation)
        mm = ops.matmul(inputs, self.kernel)
        return activation(mm + ops.cast(self.bias, mm.dtype) if self.bias is not None else mm)


_BIAS_FUSED = {gelu: bias_gelu, gelu_exact: bias_gelu_exact}
_PLAIN = {gelu: plain_gelu}  # gelu_exact is plain ops already
_ACTIVATIONS = {"gelu": gelu, "gelu_exact": gelu_exact, "relu": ops.relu, "tanh": ops.tanh, "linear": linear}


def get_activation(name: str):
    """The activation function for a `hidden_act` name (gelu, gelu_exact, relu, tanh, linear)."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; expected one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]
