"""LayerNorm over the last axis, computed in float32, whose gradient is one XLA-fused kernel.

The same variables (gamma, beta), names and results as keras.layers.LayerNormalization
(a subclass; checkpoints do not change). The forward pass is plain TensorFlow ops, so
exported SavedModels need no XLA; the backward pass, a chain of a dozen small
elementwise ops and reductions in TensorFlow's own gradient, runs as one compiled
kernel that reuses the forward's normalised input and inverse deviation.
"""

from __future__ import annotations

import contextlib
import threading

import keras
import tensorflow as tf

from bert_tf.layers.dropout import Dropout, apply_keep_mask, seed_words


def _layer_norm_backward(normalized, inv_std, gamma, dy):
    """normalized [..., H], inv_std [..., 1], gamma [H], dy [..., H] (float32) -> d input, d gamma, d beta."""
    d_normalized = dy * gamma
    mean_d = tf.reduce_mean(d_normalized, axis=-1, keepdims=True)
    mean_d_dot = tf.reduce_mean(d_normalized * normalized, axis=-1, keepdims=True)
    d_input = inv_std * (d_normalized - mean_d - normalized * mean_d_dot)
    hidden = tf.shape(dy)[-1]
    d_gamma = tf.reduce_sum(tf.reshape(dy * normalized, (-1, hidden)), axis=0)
    d_beta = tf.reduce_sum(tf.reshape(dy, (-1, hidden)), axis=0)
    return d_input, d_gamma, d_beta


_layer_norm_grad = tf.function(_layer_norm_backward, jit_compile=True, autograph=False)


def _normalize(x, epsilon):
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    inv_std = tf.math.rsqrt(variance + epsilon)
    return (x - mean) * inv_std, inv_std


@tf.function(jit_compile=True, autograph=False)
def _dropout_add_norm_forward(y, residual, seed, gamma, beta, rate, epsilon):
    dropped = apply_keep_mask(tf.cast(y, tf.float32), seed, rate)
    normalized, inv_std = _normalize(tf.cast(residual, tf.float32) + dropped, epsilon)
    return normalized * gamma + beta, normalized, inv_std


@tf.function(jit_compile=True, autograph=False)
def _dropout_add_norm_grad(normalized, inv_std, gamma, dy, seed, rate, y_dtype, residual_dtype):
    d_sum, d_gamma, d_beta = _layer_norm_backward(normalized, inv_std, gamma, tf.cast(dy, tf.float32))
    d_y = apply_keep_mask(d_sum, seed, rate)
    return tf.cast(d_y, y_dtype), tf.cast(d_sum, residual_dtype), d_gamma, d_beta


def dropout_add_layer_norm(y, residual, seed, rate: float, gamma, beta, epsilon: float):
    """layer_norm(residual + hashed_dropout(y, seed, rate)) in float32, the same values and
    gradients, with the forward and the backward each one XLA kernel (for training: the
    Transformer block's "add & norm" was a dropout kernel plus eight TensorFlow ops).
    """
    seed = seed_words(seed)

    @tf.custom_gradient
    def forward(y, residual, gamma, beta):
        out, normalized, inv_std = _dropout_add_norm_forward(y, residual, seed, gamma, beta, rate, epsilon)

        def grad(dy):
            return _dropout_add_norm_grad(normalized, inv_std, gamma, dy, seed, rate, y.dtype, residual.dtype)

        return out, grad

    return forward(y, residual, gamma, beta)


# Set while an exporter traces (bert_tf.serving.onnx_export): layer_norm as plain_layer_norm.
_PLAIN_FOR_EXPORT = threading.local()


@contextlib.contextmanager
def plain_ops_for_export():
    """Within the block, LayerNorm is traced as plain_layer_norm (no custom gradient): for converters."""
    _PLAIN_FOR_EXPORT.on = True
    try:
        yield
    finally:
        _PLAIN_FOR_EXPORT.on = False


def plain_layer_norm(x, gamma, beta, epsilon):
    """layer_norm's function as ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add: the op chain that
    ONNX Runtime fuses into one LayerNormalization (the rsqrt form of `_normalize` is not matched)."""
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = tf.reduce_mean(tf.pow(centered, 2.0), axis=-1, keepdims=True)
    return centered / tf.sqrt(variance + epsilon) * gamma + beta


def layer_norm(x, gamma, beta, epsilon):
    """(x - mean) / sqrt(var + epsilon) * gamma + beta over the last axis; float32 tensors."""
    if getattr(_PLAIN_FOR_EXPORT, "on", False):
        return plain_layer_norm(x, gamma, beta, epsilon)

    @tf.custom_gradient
    def forward(x, gamma, beta):
        normalized, inv_std = _normalize(x, epsilon)
        return normalized * gamma + beta, lambda dy: _layer_norm_grad(normalized, inv_std, gamma, dy)

    return forward(x, gamma, beta)


class LayerNorm(keras.layers.LayerNormalization):
    """keras.layers.LayerNormalization(axis=-1) with scale and center, as BERT uses it."""

    def add_and_norm(self, residual, y, dropout, training=False, seed=None, plain=False):
        """self(residual + dropout(y)): one XLA kernel each way in training with a hashed `dropout`
        (bert_tf.layers.dropout.Dropout); the plain layers otherwise. `seed` int [2]: the mask's seed
        drawn by the caller (a recomputed block repeats its mask); None draws one from `dropout`.
        plain (in training): the same function as plain ops with TensorFlow's own gradients
        (Dropout.plain_call, plain_call), no fused kernel and no custom gradient, so XLA's GPU rewriters
        (cuDNN LayerNorm) can match it."""
        if plain and training:
            return self.plain_call(residual + dropout.plain_call(y, training=training, seed=seed))
        if not (isinstance(dropout, Dropout) and dropout.fusable(training)):
            return self(residual + dropout(y, training=training))
        seed = seed if seed is not None else dropout.seed_generator.next()
        out = dropout_add_layer_norm(y, residual, seed, float(dropout.rate),
                                     tf.convert_to_tensor(self.gamma, tf.float32),
                                     tf.convert_to_tensor(self.beta, tf.float32), self.epsilon)
        return tf.cast(out, self.compute_dtype)

    def plain_call(self, inputs):
        """call's function with TensorFlow's own gradient: normalized in float32, no custom gradient."""
        normalized, _ = _normalize(tf.cast(inputs, tf.float32), self.epsilon)
        out = normalized * tf.convert_to_tensor(self.gamma, tf.float32) + tf.convert_to_tensor(self.beta, tf.float32)
        return tf.cast(out, self.compute_dtype)

    def call(self, inputs):
        x = tf.cast(inputs, tf.float32)
        out = layer_norm(x, tf.convert_to_tensor(self.gamma, tf.float32), tf.convert_to_tensor(self.beta, tf.float32),
                         self.epsilon)
        return tf.cast(out, self.compute_dtype)
