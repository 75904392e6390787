"""Training-only fused kernels give the values and gradients of the plain layers they replace."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_tf.layers.activations import Dense, bias_gelu, gelu
from bert_tf.layers.dropout import Dropout, hashed_dropout
from bert_tf.layers.normalization import LayerNorm, dropout_add_layer_norm, layer_norm


def normal(shape, seed, dtype=tf.float32):
    return tf.cast(tf.random.stateless_normal(shape, seed=[seed, 0]), dtype)


def value_and_grads(fn, inputs, dy):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = fn(*inputs)
    return out, tape.gradient(out, inputs, output_gradients=dy)


def assert_same(a, b, tol=1e-5):
    (out_a, grads_a), (out_b, grads_b) = a, b
    np.testing.assert_allclose(tf.cast(out_a, tf.float32), tf.cast(out_b, tf.float32), rtol=tol, atol=tol)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        np.testing.assert_allclose(tf.cast(ga, tf.float32), tf.cast(gb, tf.float32), rtol=tol, atol=tol)


def test_bias_gelu_matches_gelu_of_the_sum():
    inputs = [normal([40, 24], 1) * 3, normal([24], 2)]
    dy = normal([40, 24], 3)
    plain = value_and_grads(lambda mm, b: 0.5 * (mm + b) * (1 + tf.tanh(
        np.sqrt(2 / np.pi) * ((mm + b) + 0.044715 * (mm + b) ** 3))), inputs, dy)
    assert_same(value_and_grads(bias_gelu, inputs, dy), plain)


def test_gelu_dense_is_the_same_layer_in_training():
    layer = Dense(16, activation=gelu)
    x = normal([5, 8], 4)
    layer.build(x.shape)
    reference = keras.layers.Dense(16, activation=gelu)
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    dy = normal([5, 16], 5)
    for training in (True, False):
        assert_same(value_and_grads(lambda x, training=training: layer(x, training=training), [x], dy),
                    value_and_grads(lambda x: reference(x), [x], dy))
        with tf.GradientTape() as t1, tf.GradientTape() as t2:
            a, b = layer(x, training=training), reference(x)
        for ga, gb in zip(t1.gradient(a, layer.trainable_variables, dy), t2.gradient(b, reference.trainable_variables, dy),
                          strict=True):
            np.testing.assert_allclose(ga, gb, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_dropout_add_layer_norm_matches_the_composition(dtype):
    seed = tf.constant([17, 4])
    y, residual = normal([30, 64], 6, dtype), normal([30, 64], 7, dtype)
    gamma, beta = normal([64], 8) + 1, normal([64], 9)
    dy = normal([30, 64], 10)

    def composed(y, residual, gamma, beta):
        dropped = tf.cast(hashed_dropout(tf.cast(y, tf.float32), seed, 0.2), tf.float32)
        return layer_norm(tf.cast(residual, tf.float32) + dropped, gamma, beta, 1e-12)

    fused = value_and_grads(lambda *a: dropout_add_layer_norm(*a[:2], seed, 0.2, *a[2:], 1e-12),
                            [y, residual, gamma, beta], dy)
    assert fused[0].dtype == tf.float32 and [g.dtype for g in fused[1][:2]] == [dtype, dtype]
    assert_same(fused, value_and_grads(composed, [y, residual, gamma, beta], dy), 1e-5 if dtype == tf.float32 else 2e-2)
    assert (fused[1][0].numpy() == 0).mean() > 0.1  # dropped elements get no gradient


def test_add_and_norm_is_the_layers_in_inference_and_dropout_in_training():
    keras.utils.set_random_seed(1)
    norm, dropout = LayerNorm(epsilon=1e-12), Dropout(0.1)
    norm.build((None, 32))
    x, y = normal([6, 32], 11), normal([6, 32], 12)
    np.testing.assert_allclose(norm.add_and_norm(x, y, dropout), norm(x + y), rtol=1e-6, atol=1e-6)
    a, b = norm.add_and_norm(x, y, dropout, training=True), norm.add_and_norm(x, y, dropout, training=True)
    assert np.abs(a - norm(x + y)).max() > 1e-2 and np.abs(a - b).max() > 1e-2  # dropped, a new mask per call
    keras.utils.set_random_seed(1)
    np.testing.assert_allclose(norm.add_and_norm(x, y, Dropout(0.1), training=True), a, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_dropped_softmax_matches_softmax_then_dropout(dtype):
    from bert_tf.layers.attention import attention_bias_from_mask, dropped_softmax

    seed = tf.constant([3, 9])
    scores = normal([2, 3, 5, 5], 13, dtype) * 4
    bias = attention_bias_from_mask(np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    dy = normal([2, 3, 5, 5], 14, dtype)

    def composed(scores):
        probs = tf.nn.softmax(tf.cast(scores, tf.float32) * 0.125 + bias, axis=-1)
        return tf.cast(hashed_dropout(probs, seed, 0.3), dtype)

    fused = value_and_grads(lambda s: dropped_softmax(s, bias, 0.125, seed, 0.3), [scores], dy)
    assert fused[0].dtype == dtype and fused[1][0].dtype == dtype
    assert_same(fused, value_and_grads(composed, [scores], dy), 1e-5 if dtype == tf.float32 else 2e-2)
    assert not fused[0].numpy()[0, :, :, 3:].any()  # masked keys get no weight
