"""The paper's experiments in miniature: pretraining objectives (MLM+NSP, MLM only, left-to-right),
layer combinations for the feature-based approach, the frozen-feature BiLSTM tagger, and
GPT-1's auxiliary LM loss in fine-tuning. Tiny models, a few steps."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_tf.configs import BertConfig, read_run_info
from bert_tf.data import pretraining_job
from bert_tf.feature_extraction import extract_features
from bert_tf.models import BertClassifier, BertEncoder, BertPretrainer
from bert_tf.models.feature_tagger import BiLSTMFeatureTagger
from bert_tf.models.language_model import LeftToRightPretrainer, next_token_targets, unmask_input_ids
from bert_tf.models.layer_combination import LayerCombination, ScalarMix, combine_layers, parse_layer_combination
from bert_tf.pretrained import resolve_pretrained
from bert_tf.resources import SAMPLE_CORPUS
from bert_tf.runners.classifier import classification_loss
from bert_tf.runners.ner import tagging_loss
from bert_tf.runners.pretraining import pretraining_loss_fn, run_pretraining
from bert_tf.runners.pretraining_config import PretrainingConfig
from bert_tf.tasks import IGNORE_LABEL_ID
from bert_tf.tokenization import FullTokenizer, vocab_builder
from bert_tf.training import auxiliary_lm
from bert_tf.training import strategy as strategy_lib
from bert_tf.training.settings import TrainSettings

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
CONFIG = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16, type_vocab_size=2,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
B, S = 3, 10


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, len(VOCAB), (B, S)).astype(np.int32)
    mask = np.ones((B, S), np.int32)
    mask[1, 7:] = 0  # padding in two rows
    mask[2, 4:] = 0
    ids[mask == 0] = 0
    ids[:, 0] = 2  # [CLS]
    segments = np.zeros((B, S), np.int32)
    segments[0, 5:] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


@pytest.fixture(scope="module")
def causal_encoder():
    return BertEncoder(CONFIG, causal=True)


@pytest.fixture(scope="module")
def encoder():
    return BertEncoder(CONFIG)


# ------------------------------------------------------------------ left-to-right
@pytest.mark.parametrize("j", [1, 4, 8])
def test_ltr_no_token_sees_the_future(causal_encoder, encoder, j):
    inputs = _inputs()
    changed = dict(inputs, input_ids=inputs["input_ids"].copy())
    changed["input_ids"][0, j] = 5 if inputs["input_ids"][0, j] != 5 else 6
    before = causal_encoder(inputs)
    after = causal_encoder(changed)
    for a, b in zip(before["encoder_outputs"], after["encoder_outputs"], strict=True):
        diff = np.abs(a.numpy()[0] - b.numpy()[0]).max(-1)  # [S]
        np.testing.assert_array_equal(diff[:j], 0.0)  # positions before j: exactly unchanged
        assert diff[j] > 1e-4  # the changed position itself (and later ones) see it
    np.testing.assert_array_equal(before["sequence_output"].numpy()[1:], after["sequence_output"].numpy()[1:])
    # The bidirectional encoder, by contrast, lets earlier positions see token j.
    bi = np.abs(encoder(inputs)["sequence_output"].numpy()[0] - encoder(changed)["sequence_output"].numpy()[0])
    assert bi.max(-1)[:j].min() > 1e-5


def test_ltr_pools_the_last_real_token(causal_encoder):
    inputs = _inputs()
    out = causal_encoder(inputs)
    last = inputs["input_mask"].sum(1) - 1  # [B]
    sequence = out["sequence_output"].numpy()
    expected = causal_encoder.pooler(sequence[np.arange(B), last]).numpy()
    np.testing.assert_allclose(out["pooled_output"].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_ltr_labels_are_next_tokens_and_weights_exclude_padding():
    inputs = _inputs()
    positions, labels, weights = (np.asarray(t) for t in next_token_targets(inputs["input_ids"], inputs["input_mask"]))
    np.testing.assert_array_equal(positions, np.tile(np.arange(S - 1), (B, 1)))
    np.testing.assert_array_equal(labels, inputs["input_ids"][:, 1:])
    np.testing.assert_array_equal(weights, inputs["input_mask"][:, 1:])
    assert weights[2].sum() == 3  # 4 real tokens -> 3 next-token targets
    assert (labels[weights > 0] != 0).all()  # no padding is ever a label


def test_ltr_pretrainer_loss_is_next_token_cross_entropy_on_unmasked_text():
    keras.utils.set_random_seed(1)
    model = LeftToRightPretrainer(CONFIG)
    inputs = _inputs()
    original = inputs["input_ids"].copy()
    masked = original.copy()
    masked[0, 3] = 4  # [MASK] at position 3 (original id kept in masked_lm_ids)
    features = dict(inputs, input_ids=masked, masked_lm_positions=np.array([[3, 0], [0, 0], [0, 0]], np.int32),
                    masked_lm_ids=np.array([[original[0, 3], 0], [0, 0], [0, 0]], np.int32),
                    masked_lm_weights=np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]], np.float32))
    np.testing.assert_array_equal(unmask_input_ids(masked, features["masked_lm_positions"], features["masked_lm_ids"],
                                                   features["masked_lm_weights"]), original)
    out = model(features)
    # The reference: the encoder on the unmasked text, the LM head at every position, xent on the next token.
    seq = model.encoder(inputs)["sequence_output"]
    logits = model.masked_lm(seq, np.tile(np.arange(S), (B, 1)), model.encoder.word_embeddings).numpy()  # [B, S, V]
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    terms, count = [], 0
    for b in range(B):
        for i in range(S - 1):
            if inputs["input_mask"][b, i + 1]:
                terms.append(-log_probs[b, i, original[b, i + 1]])
                count += 1
    assert float(out["num_predictions"]) == count == 6 + 9 + 3
    assert float(out["lm_loss"]) == pytest.approx(np.sum(terms) / (count + 1e-5), rel=1e-4)
    loss, metrics = pretraining_loss_fn(model, features, training=False)
    assert set(metrics) == {"lm_accuracy", "lm_loss"} and float(metrics["lm_loss"][1]) == count


def test_objective_and_nsp_flag_agree():
    base = dict(bert_config=CONFIG, input_files=["x"], output_dir="/tmp/x", do_train=True)
    assert PretrainingConfig(**base).objective == "mlm_nsp"
    assert PretrainingConfig(**base, use_next_sentence_prediction=False).objective == "mlm"
    mlm = PretrainingConfig(**base, objective="mlm")
    assert not mlm.use_next_sentence_prediction and not mlm.causal
    ltr = PretrainingConfig(**base, objective="ltr")
    assert not ltr.use_next_sentence_prediction and ltr.causal
    with pytest.raises(ValueError, match="unknown objective 'gpt'"):
        PretrainingConfig(**base, objective="gpt").validate()


def test_mlm_only_has_no_next_sentence_head():
    model = BertPretrainer(CONFIG, use_next_sentence_prediction=False)
    features = dict(_inputs(), masked_lm_positions=np.ones((B, 2), np.int32),
                    masked_lm_ids=np.full((B, 2), 7, np.int32), masked_lm_weights=np.ones((B, 2), np.float32))
    out = model(features)
    assert "next_sentence_loss" not in out and float(out["loss"]) == float(out["masked_lm_loss"])


@pytest.fixture(scope="module")
def pretraining_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("objectives_data")
    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        lines = f.read().splitlines()[:300]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    vocab = vocab_builder.learn_wordpiece_vocab(vocab_builder.count_words(lines), vocab_size=300, num_unused=0)
    vocab_builder.write_vocab(str(root / "vocab.txt"), vocab)
    pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=str(root / "corpus.txt"), output_file=str(root / "train.tfrecord"),
        vocab_file=str(root / "vocab.txt"), max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1,
        num_workers=1))
    return root, BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32, max_position_embeddings=32, type_vocab_size=2)


@pytest.mark.parametrize("objective", ["ltr", "mlm"])
def test_pretraining_records_its_objective(pretraining_data, tmp_path, objective):
    root, config = pretraining_data
    out = tmp_path / objective
    results = run_pretraining(PretrainingConfig(
        bert_config=config, input_files=[str(root / "train.tfrecord")], output_dir=str(out), max_seq_length=32,
        max_predictions_per_seq=5, do_train=True, do_eval=True, train_batch_size=8, eval_batch_size=8,
        num_train_steps=3, num_warmup_steps=1,
        train=TrainSettings(learning_rate=1e-3, iterations_per_loop=3, save_checkpoints_steps=3), max_eval_steps=2, vocab_file=str(root / "vocab.txt"), do_lower_case=True, objective=objective),
        strategy_lib.get_strategy("one_device"))
    info = read_run_info(str(out))
    assert info["objective"] == objective
    assert info["causal_attention"] is (objective == "ltr")
    assert info["use_next_sentence_prediction"] is False
    assert ("lm_loss" in results) is (objective == "ltr") and ("masked_lm_loss" in results) is (objective == "mlm")
    assert "next_sentence_loss" not in results
    assert json.loads((out / "bert_config.json").read_text()) == config.to_dict()  # no objective in bert_config
    # Fine-tuning from it keeps the causal mask (or not).
    pretrained = resolve_pretrained(str(out))
    assert pretrained.causal is (objective == "ltr")
    assert pretrained.build_encoder().causal is (objective == "ltr")


# ------------------------------------------------------------------ layer combinations
def test_layer_combinations_match_numpy(encoder):
    outputs = encoder(_inputs())["encoder_outputs"]
    layers = [x.numpy() for x in outputs]  # 4 x [B, S, H]
    np.testing.assert_allclose(combine_layers(outputs, parse_layer_combination("layer:-2")), layers[2])
    np.testing.assert_allclose(combine_layers(outputs, parse_layer_combination("layer:0")), layers[0])
    np.testing.assert_allclose(combine_layers(outputs, parse_layer_combination("sum_last:3")),
                               layers[3] + layers[2] + layers[1], rtol=1e-6, atol=1e-6)
    concat = combine_layers(outputs, parse_layer_combination("concat_last:4")).numpy()
    assert concat.shape == (B, S, 4 * 16)
    np.testing.assert_allclose(concat, np.concatenate(layers[::-1], -1))  # last layer first
    np.testing.assert_allclose(combine_layers(outputs, LayerCombination("scalar_mix")), np.mean(layers, 0),
                               rtol=1e-5, atol=1e-6)
    w = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    np.testing.assert_allclose(combine_layers(outputs, LayerCombination("scalar_mix"), w),
                               np.tensordot(w, np.stack(layers), 1), rtol=1e-5, atol=1e-6)
    mix = ScalarMix(4)
    mix.build()
    mix.scalars.assign(np.log(w))  # softmax(log w) = w (w sums to 1)
    mix.gamma.assign(2.0)
    np.testing.assert_allclose(mix(outputs), 2.0 * np.tensordot(w, np.stack(layers), 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec, message", [
    ("concat", "expected layer:<index>"), ("sum_last:0", "k must be >= 1"), ("layer:x", "expected layer"),
    ("mean_last:2", "expected layer"), ("scalar_mix:2", "takes no argument")])
def test_bad_layer_combination_is_one_line(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_layer_combination(spec)


def test_layer_combination_out_of_range():
    with pytest.raises(ValueError, match="no layer 4 in a 4-layer model"):
        LayerCombination("layer", 4).layer_indexes(4)
    with pytest.raises(ValueError, match="only 4 layers"):
        LayerCombination("concat_last", 5).layer_indexes(4)
    assert LayerCombination("concat_last", 4).fit(2) == LayerCombination("concat_last", 2)


def test_extract_features_writes_the_combined_vector(encoder, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    tokenizer = FullTokenizer(str(vocab))
    out = tmp_path / "features.jsonl"
    examples = [(0, "w1 w2 w3", None), (1, "w4 w5", "w6")]
    extract_features(encoder, tokenizer, examples, str(out), max_seq_length=8,
                     combination=parse_layer_combination("concat_last:2"))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    token = lines[0]["features"][1]
    assert token["token"] == "w1" and [entry["index"] for entry in token["layers"]] == ["concat_last:2"]
    ids = tokenizer.convert_tokens_to_ids(["[CLS]", "w1", "w2", "w3", "[SEP]"])
    outs = encoder({"input_ids": np.array([ids + [0] * 3], np.int32),
                    "input_mask": np.array([[1] * 5 + [0] * 3], np.int32),
                    "segment_ids": np.zeros((1, 8), np.int32)})["encoder_outputs"]
    expected = np.concatenate([outs[3].numpy()[0, 1], outs[2].numpy()[0, 1]])
    np.testing.assert_allclose(token["layers"][0]["values"], expected, atol=2e-6)


# ------------------------------------------------------------------ feature-based tagger
def test_feature_tagger_trains_with_the_encoder_frozen():
    keras.utils.set_random_seed(3)
    model = BiLSTMFeatureTagger(BertEncoder(CONFIG), num_labels=5, lstm_units=8)  # concat_last:4 by default
    assert model.combination.spec == "concat_last:4"
    encoder_ids = {id(v) for v in model.encoder.weights}
    assert not any(id(v) in encoder_ids for v in model.trainable_variables)
    assert len(model.trainable_variables) > 0
    inputs = _inputs()
    labels = np.where(inputs["input_mask"] == 1, np.arange(S)[None, :] % 5, IGNORE_LABEL_ID).astype(np.int32)
    batch = dict(inputs, label_ids=labels)
    encoder_before = [v.numpy().copy() for v in model.encoder.weights]
    tagger_before = [v.numpy().copy() for v in model.trainable_variables]
    optimizer = keras.optimizers.Adam(1e-2)
    losses = []
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss, _ = tagging_loss(model, batch, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        assert all(g is not None for g in grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    for before, v in zip(encoder_before, model.encoder.weights, strict=True):
        np.testing.assert_array_equal(before, v.numpy())  # frozen
    assert any(not np.array_equal(b, v.numpy()) for b, v in zip(tagger_before, model.trainable_variables, strict=True))
    assert model(inputs).shape == (B, S, 5)


def test_feature_tagger_scalar_mix_is_learned():
    model = BiLSTMFeatureTagger(BertEncoder(CONFIG), num_labels=3, combination="scalar_mix", lstm_units=4)
    names = [v.path for v in model.trainable_variables]
    assert any("scalars" in n for n in names) and any("gamma" in n for n in names)


# ------------------------------------------------------------------ auxiliary LM loss (GPT-1)
def _aux_batch():
    inputs = _inputs(seed=5)
    return dict(inputs, label_ids=np.array([0, 1, 0], np.int32))


@pytest.mark.parametrize("causal", [False, True])
def test_aux_lm_loss_changes_the_loss_and_reaches_the_lm_head(causal):
    vocab = {t: i for i, t in enumerate(VOCAB)}

    def model_fn():
        keras.utils.set_random_seed(7)
        return BertClassifier(BertEncoder(CONFIG, causal=causal), num_labels=2)

    model_fn_aux, loss_fn_aux = auxiliary_lm.with_auxiliary_lm(model_fn, classification_loss, 0.5, causal=causal,
                                                               vocab=vocab)
    plain = model_fn()
    model = model_fn_aux()
    assert hasattr(model, "masked_lm") and not hasattr(plain, "masked_lm")
    batch = _aux_batch()
    tf.random.set_seed(0)
    plain_loss, _ = classification_loss(plain, batch, training=False)
    with tf.GradientTape() as tape:
        loss, metrics = loss_fn_aux(model, batch, training=False)
    # Same weights in both (same seed): the difference is exactly 0.5 * the LM loss.
    assert float(metrics["task_loss"]) == pytest.approx(float(plain_loss), rel=1e-5)
    lm_loss = float(metrics["aux_lm_loss"][0])
    assert lm_loss > 0.1
    assert float(loss) == pytest.approx(float(plain_loss) + 0.5 * lm_loss, rel=1e-5)
    head_vars = model.masked_lm.trainable_variables
    grads = tape.gradient(loss, head_vars)
    assert all(g is not None and float(tf.reduce_max(tf.abs(g))) > 0 for g in grads)
    count = float(metrics["aux_lm_loss"][1])
    if causal:
        assert count == float(batch["input_mask"][:, 1:].sum())
    else:
        assert 0 < count <= float(batch["input_mask"].sum())


def test_random_masking_only_touches_real_non_special_tokens():
    ids = np.tile(np.arange(5, 45, dtype=np.int32)[None, :40] % len(VOCAB), (64, 1))
    ids[:, 0] = 2
    ids[:, -1] = 3
    mask = np.ones_like(ids)
    mask[:, 30:] = 0
    masked, labels, weights = (t.numpy() for t in auxiliary_lm.random_masking(
        ids, mask, mask_id=4, special_ids=[0, 1, 2, 3, 4], vocab_size=len(VOCAB), seed=tf.constant([1, 2])))
    np.testing.assert_array_equal(labels, ids)
    chosen = weights > 0
    assert not chosen[:, 0].any() and not chosen[:, 30:].any()  # [CLS] and padding never
    assert 0.10 < chosen[:, 1:30].mean() < 0.20  # ~15% of the real tokens
    np.testing.assert_array_equal(masked[~chosen], ids[~chosen])  # the rest is untouched
    share_masked = (masked[chosen] == 4).mean()
    assert 0.7 < share_masked < 0.9  # ~80% become [MASK]


def test_aux_lm_weight_must_not_be_negative(tmp_path):
    from bert_tf.pretrained import Pretrained
    from bert_tf.runners import common

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    settings = common.RunSettings(pretrained=Pretrained(CONFIG, str(vocab), None, None, None),
                                  strategy=strategy_lib.get_strategy("one_device"), aux_lm_weight=-1.0)
    with pytest.raises(ValueError, match="aux_lm_weight must be >= 0"):
        common.make_trainer(settings, str(tmp_path / "out"), lambda: None, classification_loss,
                            num_train_steps=1, global_batch_size=2, warmup_proportion=0.1)


def test_export_rebuilds_a_causal_encoder_from_the_run_info():
    from bert_tf.model_dir import build_task_model

    info = {"task_type": "classification", "label_list": ["a", "b"]}
    assert build_task_model(CONFIG, dict(info, causal_attention=True)).encoder.causal is True
    assert build_task_model(CONFIG, info).encoder.causal is False
    assert build_task_model(CONFIG, {"task_type": "span", "causal_attention": True}).encoder.causal is True
