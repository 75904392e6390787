"""The hashed dropout: rate, scaling, the gradient's mask, independence between calls and elements."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_tf.layers.dropout import Dropout, hashed_dropout, keep_mask

N = 1 << 20


def mask(seed, rate=0.1, shape=(N,)):
    return keep_mask(tf.constant(shape), tf.constant(seed, tf.uint32), rate).numpy()


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_keep_fraction_is_one_minus_rate(rate):
    kept = mask([7, 11], rate).mean()
    # Binomial standard deviation at N = 2^20 is <= 5e-4; allow 6 of them.
    assert abs(kept - (1 - rate)) < 3e-3


def test_kept_values_are_scaled_and_the_gradient_uses_the_same_mask():
    x = tf.random.stateless_normal([64, 512], seed=[1, 2])
    dy = tf.random.stateless_normal([64, 512], seed=[3, 4])
    seed = tf.constant([5, 6], tf.int32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hashed_dropout(x, seed, 0.25)
    dx = tape.gradient(y, x, output_gradients=dy).numpy()
    kept = mask([5, 6], 0.25, (64, 512))
    np.testing.assert_array_equal(y.numpy() != 0, kept)
    np.testing.assert_allclose(y.numpy()[kept], x.numpy()[kept] / 0.75, rtol=1e-6)
    np.testing.assert_allclose(dx[kept], dy.numpy()[kept] / 0.75, rtol=1e-6)
    assert not dx[~kept].any()


def test_same_seed_same_mask_and_neighbouring_seeds_are_independent():
    a = mask([1, 2])
    np.testing.assert_array_equal(a, mask([1, 2]))
    for other in ([1, 3], [2, 2], [1 << 31, 2]):  # the Keras SeedGenerator steps the second word by 1
        b = mask(other)
        assert (a != b).any()
        assert abs((a & b).mean() - 0.81) < 3e-3  # P(both keep) = 0.9 * 0.9 when independent


def test_neighbouring_elements_are_uncorrelated():
    a = mask([9, 9], 0.5, (1024, 1024)).astype(np.float64)
    for x, y in ((a[:, :-1], a[:, 1:]), (a[:-1], a[1:]), (a[:, :-64], a[:, 64:])):
        assert abs(np.corrcoef(x.ravel(), y.ravel())[0, 1]) < 0.01


def test_layer_is_keras_dropout_with_the_hashed_mask():
    keras.utils.set_random_seed(3)
    layer = Dropout(0.1)
    x = tf.ones([32, 256])
    np.testing.assert_array_equal(layer(x), x)  # inference: identity
    first, second = layer(x, training=True).numpy(), layer(x, training=True).numpy()
    assert (first != second).any()  # a new seed per call
    assert set(np.unique(first)) == {0.0, np.float32(1 / 0.9)}
    keras.utils.set_random_seed(3)
    np.testing.assert_array_equal(Dropout(0.1)(x, training=True), first)  # repeatable
    assert isinstance(Dropout.from_config(layer.get_config()), Dropout)
    np.testing.assert_array_equal(Dropout(0.0)(x, training=True), x)
    half = Dropout(0.5, dtype="mixed_bfloat16")(tf.ones([8, 8]), training=True)
    assert half.dtype == tf.bfloat16 and set(np.unique(half.numpy().astype(np.float32))) <= {0.0, 2.0}
