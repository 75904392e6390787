"""Keras-native models: every model saves to .keras and loads back with equal outputs; the task models
compile / fit / evaluate / predict on tf.data dict inputs; skip_padding stays exact under fit."""

import contextlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_tf.configs import BertConfig
from bert_tf.models import (
    BertClassifier,
    BertEncoder,
    BertMultipleChoice,
    BertPretrainer,
    BertSpanLabeler,
    BertTokenClassifier,
)
from bert_tf.models.feature_tagger import BiLSTMFeatureTagger
from bert_tf.models.language_model import LeftToRightPretrainer

TINY = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                  max_position_embeddings=16, type_vocab_size=2)
B, S, C = 4, 8, 3


def inputs(batch=B, seq=S, seed=0, choices=None):
    """Encoder inputs with padding (lengths 3..seq); [batch, choices, seq] for multiple choice."""
    rng = np.random.default_rng(seed)
    shape = (batch, seq) if choices is None else (batch, choices, seq)
    lengths = rng.integers(3, seq + 1, shape[:-1])
    mask = (np.arange(seq) < lengths[..., None]).astype("int32")
    return {"input_ids": (rng.integers(5, TINY.vocab_size, shape) * mask).astype("int32"), "input_mask": mask,
            "segment_ids": ((np.arange(seq) >= 4) * mask).astype("int32")}


def packed_inputs():
    """One packed row holding two sequences (lengths 3 and 4) and one padded slot: [1, S] + cls_positions [1, 2]."""
    return {"input_ids": np.array([[2, 7, 3, 2, 9, 11, 3, 0]], "int32"),
            "segment_ids": np.zeros((1, S), "int32"),
            "sequence_ids": np.array([[1, 1, 1, 2, 2, 2, 2, 0]], "int32"),
            "position_ids": np.array([[0, 1, 2, 0, 1, 2, 3, 0]], "int32"),
            "cls_positions": np.array([[0, 3]], "int32")}


def pretraining_features():
    x = inputs()
    return {**x, "masked_lm_positions": np.array([[1, 2]] * B, "int32"),
            "masked_lm_ids": np.array([[5, 6]] * B, "int32"), "masked_lm_weights": np.ones((B, 2), "float32"),
            "next_sentence_labels": np.array([0, 1, 0, 1], "int32")}


# name -> (builder, inputs, config fields the loaded model must keep)
MODELS = {
    "encoder": (lambda: BertEncoder(TINY), inputs, {}),
    "causal_encoder": (lambda: BertEncoder(TINY, causal=True), inputs, {"causal": True}),
    "pretrainer": (lambda: BertPretrainer(TINY, skip_padding=False), pretraining_features, {"skip_padding": False}),
    "ltr_pretrainer": (lambda: LeftToRightPretrainer(TINY), pretraining_features, {}),
    "classifier": (lambda: BertClassifier(BertEncoder(TINY), num_labels=3, skip_padding=False), inputs,
                   {"num_labels": 3, "skip_padding": False}),
    "classifier_packed": (lambda: BertClassifier(BertEncoder(TINY), num_labels=2), packed_inputs,
                          {"skip_padding": True}),
    "causal_classifier": (lambda: BertClassifier(BertEncoder(TINY, causal=True), num_labels=2), inputs, {}),
    "span_labeler": (lambda: BertSpanLabeler(BertEncoder(TINY)), inputs, {}),
    "multiple_choice": (lambda: BertMultipleChoice(BertEncoder(TINY), num_choices=C),
                        lambda: inputs(choices=C), {"num_choices": C}),
    "token_classifier": (lambda: BertTokenClassifier(BertEncoder(TINY), num_labels=5), inputs, {"num_labels": 5}),
    "feature_tagger": (lambda: BiLSTMFeatureTagger(BertEncoder(TINY), 4, "sum_last:2", lstm_units=6), inputs,
                       {"combination": "sum_last:2", "lstm_units": 6}),
}


def flat(outputs):
    return [np.asarray(t) for t in keras.tree.flatten(outputs)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_keras_file_round_trip(name, tmp_path):
    build, make_inputs, kept = MODELS[name]
    model = build()
    x = make_inputs()
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is type(model)
    config = loaded.get_config()
    for key, value in kept.items():
        assert config[key] == value
    encoder = loaded if isinstance(loaded, BertEncoder) else loaded.encoder
    assert encoder.config == TINY
    assert encoder.causal == (model if isinstance(model, BertEncoder) else model.encoder).causal
    assert len(loaded.weights) == len(model.weights)
    for a, b in zip(flat(model(x)), flat(loaded(x)), strict=True):
        np.testing.assert_array_equal(b, a)
    fresh = build()  # another random initialisation: the loaded outputs are the saved weights', not chance
    assert any(not np.allclose(a, b) for a, b in zip(flat(model(x)), flat(fresh(x)), strict=True))


def test_heads_serialize_on_their_own():
    from bert_tf.models import ClassificationHead, MaskedLMHead, TokenTaggingHead

    for head in (ClassificationHead(3, 16, dropout_rate=0.2), MaskedLMHead(30, 16, "relu"), TokenTaggingHead(4, 16)):
        again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(head))
        assert type(again) is type(head) and again.get_config() == head.get_config()


# ------------------------------------------------------------------ compile / fit / evaluate / predict
def dataset(x, y, batch=2):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


SPARSE_XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def task_cases():
    rng = np.random.default_rng(1)
    x, mc = inputs(), inputs(choices=C)
    return {
        "classifier": (lambda: BertClassifier(BertEncoder(TINY), num_labels=3), x, rng.integers(0, 3, B),
                       SPARSE_XENT, ["sparse_categorical_accuracy"]),
        "span_labeler": (lambda: BertSpanLabeler(BertEncoder(TINY)), x,
                         {"start_logits": rng.integers(0, 3, B), "end_logits": rng.integers(3, 6, B)},
                         {"start_logits": SPARSE_XENT, "end_logits": SPARSE_XENT},
                         {"start_logits": ["sparse_categorical_accuracy"]}),
        "multiple_choice": (lambda: BertMultipleChoice(BertEncoder(TINY), num_choices=C), mc, rng.integers(0, C, B),
                            SPARSE_XENT, ["sparse_categorical_accuracy"]),
        "token_classifier": (lambda: BertTokenClassifier(BertEncoder(TINY), num_labels=5), x,
                             rng.integers(0, 5, (B, S)), SPARSE_XENT, ["sparse_categorical_accuracy"]),
    }


@pytest.mark.parametrize("name", sorted(task_cases()))
def test_compile_fit_evaluate_predict(name):
    build, x, y, loss, metrics = task_cases()[name]
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss, metrics=metrics)
    before = model.evaluate(dataset(x, y), verbose=0, return_dict=True)
    # Heads on the sequence output leave the pooler unused: Keras names it, and nothing else, as gradient-free.
    expected = pytest.warns(UserWarning, match=re.escape(
        "Gradients do not exist for variables ['bert/pooler/kernel', 'bert/pooler/bias']"))
    with expected if name in ("span_labeler", "token_classifier") else contextlib.nullcontext():
        history = model.fit(dataset(x, y).repeat(8), shuffle=False, verbose=0)  # 16 steps on the same 4 examples
    after = model.evaluate(dataset(x, y), verbose=0, return_dict=True)
    assert after["loss"] < 0.9 * before["loss"], (before, after)
    assert np.isfinite(history.history["loss"]).all()
    assert len(after) == len(before) >= 2  # the loss and the compiled metrics
    predicted = model.predict(dataset(x, y), verbose=0)
    for a, b in zip(flat(predicted), flat(model(x)), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_default_jit_compile_is_off_on_a_cpu_only_machine():
    """Keras 3's jit_compile="auto" on the TF backend: no XLA without an accelerator (with one, XLA; the next
    test fits a skip_padding model under XLA too)."""
    if [d for d in tf.config.list_physical_devices() if d.device_type != "CPU"]:
        pytest.skip("an accelerator: auto means XLA here")
    model = BertClassifier(BertEncoder(TINY), num_labels=2)
    model.compile(optimizer="sgd", loss=SPARSE_XENT)
    assert model.jit_compile is False


@pytest.mark.parametrize("jit_compile", [False, True])
def test_fit_with_skip_padding_equals_the_padded_one(jit_compile):
    """Two SGD steps of fit, each batch padded differently: the same losses and weights with skip_padding on
    and off (dropout off in the encoder; the head's dropout mask is drawn from the same seed on the same
    [B, H] shape), also when XLA compiles the skipping model (its row count then bounded by B * S), whose
    step is traced once."""
    config = TINY.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    x, y = inputs(batch=2 * B, seed=3), np.arange(2 * B) % 2
    results = {}
    for skip in (False, True):
        keras.utils.set_random_seed(7)
        model = BertClassifier(BertEncoder(config), num_labels=2, skip_padding=skip)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=SPARSE_XENT, jit_compile=jit_compile and skip)
        initial = [w.numpy() for w in model.weights]
        traces = []
        train_step = model.train_step  # runs in Python only while fit traces its step function

        def counted(data, train_step=train_step, traces=traces):
            traces.append(1)
            return train_step(data)

        model.train_step = counted
        history = model.fit(dataset(x, y, batch=B), shuffle=False, verbose=0)
        assert len(traces) == 1
        results[skip] = history.history["loss"][0], [w.numpy() for w in model.weights]
    (loss_full, weights_full), (loss_skip, weights_skip) = results[False], results[True]
    assert abs(loss_skip - loss_full) < 1e-6
    assert max(np.abs(a - b).max() for a, b in zip(weights_skip, initial, strict=True)) > 1e-3  # the steps moved
    for a, b in zip(weights_skip, weights_full, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
