"""Heads and models: masked-LM at masked positions only, NSP, the pretraining losses of docs/reference.md §3, task heads."""

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

CONFIG = BertConfig(
    vocab_size=30,
    hidden_size=8,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=16,
    type_vocab_size=2,
)
B, S, P = 3, 8, 4


def features(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, CONFIG.vocab_size, (B, S)).astype("int32"),
        "input_mask": np.ones((B, S), "int32"),
        "segment_ids": np.zeros((B, S), "int32"),
        "masked_lm_positions": np.array([[1, 2, 5, 0], [3, 4, 0, 0], [7, 6, 2, 1]], "int32"),
        "masked_lm_ids": rng.integers(0, CONFIG.vocab_size, (B, P)).astype("int32"),
        "masked_lm_weights": np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], "float32"),
        "next_sentence_labels": np.array([[0], [1], [1]], "int32"),
    }


@pytest.fixture(scope="module")
def pretrainer():
    model = BertPretrainer(CONFIG)
    rng = np.random.default_rng(7)
    for v in model.weights:  # larger than init so logits are far from uniform
        v.assign(rng.normal(0, 0.5, v.shape).astype("float32") + (1.0 if v.path.endswith("gamma") else 0.0))
    return model


def np_layer_norm(x, gamma, beta, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_masked_lm_logits_only_at_masked_positions(pretrainer):
    f = features()
    logits = pretrainer.logits(f)["masked_lm_logits"].numpy()
    assert logits.shape == (B, P, CONFIG.vocab_size)
    seq = pretrainer.encoder(f)["sequence_output"].numpy()
    head = pretrainer.masked_lm
    for b in range(B):
        h = seq[b, f["masked_lm_positions"][b]]  # [P, H]
        t = h @ head.transform.kernel.numpy() + head.transform.bias.numpy()
        t = 0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t**3)))
        t = np_layer_norm(t, head.layer_norm.gamma.numpy(), head.layer_norm.beta.numpy())
        expected = t @ pretrainer.encoder.word_embeddings.numpy().T + head.output_bias.numpy()
        np.testing.assert_allclose(logits[b], expected, rtol=1e-4, atol=1e-4)


def test_masked_lm_is_tied_to_word_embeddings(pretrainer):
    names = [v.path for v in pretrainer.weights]
    assert sum("word_embeddings" in n for n in names) == 1
    assert not any("masked_lm" in n and "embeddings" in n for n in names)


def test_tied_logits_gradient_is_the_matmul_gradient():
    from bert_tf.models.heads import _logits_of_table

    x = tf.random.stateless_normal([6, 8], seed=[1, 2])
    table = tf.random.stateless_normal([30, 8], seed=[3, 4])
    dy = tf.random.stateless_normal([6, 30], seed=[5, 6])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, table])
        ours, plain = _logits_of_table(x, table), x @ tf.transpose(table)
    np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(tape.gradient(ours, [x, table], dy), tape.gradient(plain, [x, table], dy), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_tied_word_embedding_gradient_sums_the_lookup_and_the_output_layer(pretrainer, monkeypatch):
    from bert_tf.models import pretrainer as pretrainer_lib

    f = features(3)

    def gradients():
        with tf.GradientTape() as tape:
            loss = pretrainer(f)["loss"]  # no dropout: the same function both times
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, pretrainer.trainable_variables)]

    ours = gradients()
    monkeypatch.setattr(pretrainer_lib, "_tied", lambda table: (tf.identity(table), tf.identity(table)))
    for a, b, v in zip(ours, gradients(), pretrainer.trainable_variables, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=v.path)


def test_pretraining_losses_and_metrics_follow_the_original(pretrainer):
    f = features()
    logits = {k: v.numpy() for k, v in pretrainer.logits(f).items()}
    out = {k: float(v) for k, v in pretrainer(f).items()}

    w = f["masked_lm_weights"]
    lp = np_log_softmax(logits["masked_lm_logits"].astype("float64"))
    xent = -np.take_along_axis(lp, f["masked_lm_ids"][..., None], -1)[..., 0]
    mlm_loss = (w * xent).sum() / (w.sum() + 1e-5)
    correct = logits["masked_lm_logits"].argmax(-1) == f["masked_lm_ids"]
    mlm_acc = (w * correct).sum() / w.sum()
    labels = f["next_sentence_labels"][:, 0]
    nsp_lp = np_log_softmax(logits["next_sentence_logits"].astype("float64"))
    nsp_loss = -nsp_lp[np.arange(B), labels].mean()
    nsp_acc = (logits["next_sentence_logits"].argmax(-1) == labels).mean()

    assert out["masked_lm_loss"] == pytest.approx(mlm_loss, rel=1e-5)
    assert out["next_sentence_loss"] == pytest.approx(nsp_loss, rel=1e-5)
    assert out["loss"] == pytest.approx(mlm_loss + nsp_loss, rel=1e-5)
    assert out["masked_lm_accuracy"] == pytest.approx(mlm_acc, abs=1e-6)
    assert out["next_sentence_accuracy"] == pytest.approx(nsp_acc, abs=1e-6)


def test_padded_predictions_do_not_count(pretrainer):
    f = features()
    changed = dict(f, masked_lm_ids=f["masked_lm_ids"].copy())
    changed["masked_lm_ids"][f["masked_lm_weights"] == 0] = 0  # only the weight-0 slots change
    changed["masked_lm_ids"][0, 3] = 17
    a, b = pretrainer(f), pretrainer(changed)
    assert float(a["masked_lm_loss"]) == pytest.approx(float(b["masked_lm_loss"]), rel=1e-6)
    assert float(a["masked_lm_accuracy"]) == pytest.approx(float(b["masked_lm_accuracy"]), abs=1e-7)


def test_mlm_only_pretrainer():
    model = BertPretrainer(CONFIG, use_next_sentence_prediction=False)
    f = features()
    del f["next_sentence_labels"]
    out = model(f)
    assert set(out) == {"loss", "masked_lm_loss", "masked_lm_accuracy"}
    assert float(out["loss"]) == float(out["masked_lm_loss"])
    assert not any("next_sentence" in v.path for v in model.weights)


def test_pretrainer_trains_under_xla(pretrainer):
    f = features()
    model = BertPretrainer(CONFIG)
    optimizer = keras.optimizers.SGD(0.1)
    variables = model.trainable_variables

    @tf.function(jit_compile=True)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = model(batch, training=False)["loss"]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    first = float(step(f))
    for _ in range(5):
        last = float(step(f))
    assert last < first


@pytest.mark.half_precision
def test_heads_stay_float32_under_mixed_precision():
    previous = keras.config.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        model = BertPretrainer(CONFIG)
        logits = model.logits(features())
        out = model(features())
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    assert model.encoder(features())["sequence_output"].dtype == tf.bfloat16
    assert logits["masked_lm_logits"].dtype == tf.float32
    assert all(v.dtype == tf.float32 for v in out.values())
    assert np.isfinite(float(out["loss"]))


def test_next_sentence_weights_use_the_original_layout(pretrainer):
    assert tuple(pretrainer.next_sentence.projection.output_weights.shape) == (2, CONFIG.hidden_size)


@pytest.fixture(scope="module")
def encoder():
    return BertEncoder(CONFIG)


def test_classifier_and_regression(encoder):
    f = features()
    pooled = encoder(f)["pooled_output"].numpy()
    clf = BertClassifier(encoder, num_labels=3)
    logits = clf(f).numpy()
    proj = clf.head.projection
    np.testing.assert_allclose(logits, pooled @ proj.output_weights.numpy().T + proj.output_bias.numpy(), atol=1e-5)
    assert tuple(proj.output_weights.shape) == (3, CONFIG.hidden_size)
    assert BertClassifier(encoder, num_labels=1)(f).shape == (B, 1)
    # Dropout 0.1 on the pooled output in training only.
    assert not np.allclose(clf(f, training=True).numpy(), logits)


def test_classifier_skipping_padding_gives_the_same_logits(encoder):
    f = features()
    lengths = np.array([S, S // 2, 3])
    mask = (np.arange(S)[None, :] < lengths[:, None]).astype("int32")
    f = dict(f, input_mask=mask, input_ids=f["input_ids"] * mask)
    clf = BertClassifier(encoder, num_labels=3)
    assert clf.skip_padding
    skipped = clf(f).numpy()
    clf.skip_padding = False
    full = clf(f).numpy()
    expected = encoder(f)["pooled_output"].numpy() @ clf.head.projection.output_weights.numpy().T
    np.testing.assert_allclose(skipped, full, atol=1e-5)
    np.testing.assert_allclose(full, expected + clf.head.projection.output_bias.numpy(), atol=1e-5)


@pytest.mark.parametrize("skip_padding", [True, False])
def test_mean_pooling_classifier_reads_the_mean_of_the_real_tokens(encoder, skip_padding):
    """pooling="mean": the last layer averaged over each input's real tokens (padding left out), no pooler; the
    same with and without skipping padding; a Keras config round trip keeps it; any other pooling is refused."""
    f = features()
    lengths = np.array([S, S // 2, 3])
    mask = (np.arange(S)[None, :] < lengths[:, None]).astype("int32")
    f = dict(f, input_mask=mask, input_ids=f["input_ids"] * mask)
    clf = BertClassifier(encoder, num_labels=3, skip_padding=skip_padding, pooling="mean")
    sequence = encoder(f)["sequence_output"].numpy()  # [B, S, H]
    mean = (sequence * mask[:, :, None]).sum(1) / lengths[:, None]
    proj = clf.head.projection
    np.testing.assert_allclose(clf(f).numpy(), mean @ proj.output_weights.numpy().T + proj.output_bias.numpy(),
                               atol=1e-5)
    # Not the [CLS] reading, and padding changes nothing: other ids at padded positions give the same logits.
    assert not np.allclose(clf(f).numpy(), BertClassifier(encoder, num_labels=3)(f).numpy(), atol=1e-3)
    noisy = dict(f, input_ids=np.where(mask == 1, f["input_ids"], 7).astype("int32"))
    np.testing.assert_allclose(clf(noisy).numpy(), clf(f).numpy(), atol=1e-5)
    again = BertClassifier.from_config(clf.get_config())
    assert again.pooling == "mean" and clf.get_config()["pooling"] == "mean"
    with pytest.raises(ValueError, match=r"^pooling must be one of cls, mean, got 'max'$"):
        BertClassifier(encoder, num_labels=3, pooling="max")


def test_mean_pooling_classifier_has_no_hugging_face_layout(encoder, tmp_path):
    """transformers' BertForSequenceClassification reads the pooler at [CLS]: writing a mean-pooled classifier in
    its layout would serve other numbers, so it is a one-line error (the [CLS] one writes)."""
    from bert_tf.checkpoints import write_hf_checkpoint
    from bert_tf.errors import CheckpointError

    with pytest.raises(CheckpointError, match=r"^a classifier on the mean of its tokens \(--pooling=mean\) has no "):
        write_hf_checkpoint(BertClassifier(encoder, num_labels=2, pooling="mean"), str(tmp_path / "mean"))
    assert not (tmp_path / "mean").exists() or not any((tmp_path / "mean").iterdir())


def test_span_labeler(encoder):
    f = features()
    model = BertSpanLabeler(encoder)
    out = model(f)
    seq = encoder(f)["sequence_output"].numpy()
    proj = model.head.projection
    full = seq @ proj.output_weights.numpy().T + proj.output_bias.numpy()  # [B, S, 2]
    np.testing.assert_allclose(out["start_logits"], full[..., 0], atol=1e-5)
    np.testing.assert_allclose(out["end_logits"], full[..., 1], atol=1e-5)


def test_multiple_choice_scores_each_choice_independently(encoder):
    choices = 4
    rng = np.random.default_rng(3)
    inputs = {
        "input_ids": rng.integers(0, CONFIG.vocab_size, (2, choices, S)).astype("int32"),
        "input_mask": np.ones((2, choices, S), "int32"),
        "segment_ids": np.zeros((2, choices, S), "int32"),
    }
    model = BertMultipleChoice(encoder, num_choices=choices)
    logits = model(inputs).numpy()
    assert logits.shape == (2, choices)
    proj = model.head.projection
    one = {k: v[1, 2][None] for k, v in inputs.items()}
    score = encoder(one)["pooled_output"].numpy() @ proj.output_weights.numpy().T + proj.output_bias.numpy()
    assert logits[1, 2] == pytest.approx(float(score[0, 0]), abs=1e-5)


def test_token_classifier(encoder):
    model = BertTokenClassifier(encoder, num_labels=5)
    assert model(features()).shape == (B, S, 5)
