"""TF-Hub's BERT workflow on bert_tf exports: the preprocessor SavedModel gives FullTokenizer's ids with
TF-Hub's interface and trimming, and the encoder export fine-tunes through hub.KerasLayer(trainable=True)
in a tf_keras model, in a fresh process (tensorflow_hub and tf_keras are test-only dependencies)."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import float32_tolerance

from bert_tf.configs import BertConfig
from bert_tf.export import export_preprocessor, export_serving_model
from bert_tf.models.encoder import build_encoder
from bert_tf.tokenization import BasicTokenizer, FullTokenizer

pytestmark = pytest.mark.slow

SEQ = 16
SENTENCES = [
    "The cat sat on the mat.", "Crème Brûlée, café!", "ah博推zz 中文 text", "HeLLo!how are you?",
    "naïve résumé — “quoted” (x) $5", "unwanted running dogs", "Straße İstanbul ﬁne", "",
    "the mat " * 12,  # longer than SEQ: truncated
]
LABELS = [1, 0, 1, 0, 1, 0, 1, 0, 1]
SIZES = dict(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
             max_position_embeddings=32)
# Two float32 computations of the encoder that differ only in rounding (conftest.float32_tolerance):
# per block sums over hidden, intermediate and sequence terms, then the pooler; values up to ~10.
TOLERANCE = float32_tolerance(10.0, SIZES["num_hidden_layers"] * (8 + 16 + SEQ) + 8)


def _vocab(texts, lower):
    """Specials + every basic word whole or as two pieces; every fifth word left out ([UNK])."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = [w for t in texts for w in BasicTokenizer(do_lower_case=lower).tokenize(t)]
    for i, word in enumerate(dict.fromkeys(words)):
        if i % 5 == 4:
            continue
        pieces = [word] if i % 2 or len(word) < 3 else [word[:2], "##" + word[2:]]
        vocab.extend(p for p in pieces if p not in vocab)
    return vocab


def _write(path, tokens):
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    vocab_files = {lower: _write(base / f"vocab_{lower}.txt", _vocab(SENTENCES, lower)) for lower in (True, False)}
    keras.utils.set_random_seed(0)  # one initialization: the loss test below has a fixed starting point
    encoder = build_encoder(BertConfig(vocab_size=len(_vocab(SENTENCES, True)), **SIZES))
    export_serving_model(encoder, "encoder", str(base / "encoder"), vocab_files[True], do_lower_case=True,
                         max_seq_length=SEQ)
    for lower in (True, False):
        export_preprocessor(str(base / f"preprocess_{lower}"), vocab_files[lower], do_lower_case=lower,
                            seq_length=SEQ)
    return {"base": base, "encoder": encoder, "vocab": vocab_files}


def _round_robin_pack(segments, seq_length, cls_id, sep_id):
    """TF-Hub's rule in plain Python: one piece to each segment in turn, [CLS] A [SEP] B [SEP], padded."""
    budget, kept, lengths = seq_length - 1 - len(segments), [0] * len(segments), [len(s) for s in segments]
    while budget > 0 and any(k < n for k, n in zip(kept, lengths, strict=True)):
        for i in range(len(segments)):
            if budget > 0 and kept[i] < lengths[i]:
                kept[i] += 1
                budget -= 1
    ids, types = [cls_id], [0]
    for i, (segment, k) in enumerate(zip(segments, kept, strict=True)):
        ids += segment[:k] + [sep_id]
        types += [min(i, 1)] * (k + 1)
    pad = seq_length - len(ids)
    return ids + [0] * pad, [1] * len(ids) + [0] * pad, types + [0] * pad


@pytest.mark.parametrize("lower", [True, False])
def test_preprocessor_tokenize_and_default_call_give_full_tokenizers_ids(exports, lower):
    pre = tf.saved_model.load(str(exports["base"] / f"preprocess_{lower}"))
    full = FullTokenizer(exports["vocab"][lower], do_lower_case=lower)
    basic = BasicTokenizer(do_lower_case=lower)
    tokenized = pre.tokenize(tf.constant(SENTENCES))
    assert isinstance(tokenized, tf.RaggedTensor) and tokenized.dtype == tf.int32 and tokenized.shape.rank == 3
    expected = [[full.convert_tokens_to_ids(full.wordpiece_tokenizer.tokenize(w)) for w in basic.tokenize(t)]
                for t in SENTENCES]
    assert tokenized.to_list() == expected
    assert any(len(word) == 2 for row in expected for word in row)  # words split into pieces
    assert any(full.vocab["[UNK]"] in word for row in expected for word in row)

    packed = pre(tf.constant(SENTENCES))
    rows = [_round_robin_pack([full.convert_tokens_to_ids(full.tokenize(t))], SEQ, 2, 3) for t in SENTENCES]
    for name, column in zip(("input_word_ids", "input_mask", "input_type_ids"), zip(*rows, strict=True), strict=True):
        assert packed[name].dtype == tf.int32
        np.testing.assert_array_equal(packed[name], np.array(column))
    assert packed["input_mask"].numpy()[-1].sum() == SEQ  # the long sentence fills the row


def test_bert_pack_inputs_trims_round_robin_as_tf_hub_and_matches_the_raw_text_export(exports):
    pre = tf.saved_model.load(str(exports["base"] / "preprocess_True"))
    full = FullTokenizer(exports["vocab"][True], do_lower_case=True)
    texts_a = ["the mat " * 6, "hello", "the cat sat on the mat.", "café", "unwanted running dogs"]
    texts_b = ["the cat", "the mat " * 9, "how are you? " * 3, "", "ah博推zz 中文"]
    segments = [pre.tokenize(tf.constant(texts)) for texts in (texts_a, texts_b)]
    for seq_length in (5, 9, SEQ):
        got = pre.bert_pack_inputs(segments, seq_length=seq_length)
        for row, (a, b) in enumerate(zip(texts_a, texts_b, strict=True)):
            ids = [full.convert_tokens_to_ids(full.tokenize(t)) for t in (a, b)]
            want = _round_robin_pack(ids, seq_length, 2, 3)
            assert [got[k].numpy()[row].tolist() for k in ("input_word_ids", "input_mask", "input_type_ids")] == \
                list(want), (seq_length, a, b)
    assert pre.bert_pack_inputs(segments[:1])["input_word_ids"].shape == (5, SEQ)  # default: the export's length
    # For two non-empty segments round-robin keeps the original's longest-first lengths: the encoder
    # export's own packing of the same texts.
    encoder_export = tf.saved_model.load(str(exports["base"] / "encoder"))
    pairs = [i for i, b in enumerate(texts_b) if b]
    ours = encoder_export.signatures["preprocess"](text_a=tf.constant([texts_a[i] for i in pairs]),
                                                   text_b=tf.constant([texts_b[i] for i in pairs]))
    hubs = pre.bert_pack_inputs([tf.gather(s, pairs) for s in segments], seq_length=SEQ)
    for name in ("input_word_ids", "input_mask", "input_type_ids"):
        np.testing.assert_array_equal(hubs[name], ours[name])


FRESH_PROCESS = textwrap.dedent("""
    import json, sys, warnings
    warnings.filterwarnings("ignore")
    import numpy as np
    import tensorflow as tf
    import tensorflow_hub as hub
    import tensorflow_text  # noqa: F401
    import tf_keras

    args = json.loads(sys.argv[1])
    tf_keras.utils.set_random_seed(0)
    texts, labels = tf.constant(args["texts"]), tf.constant(args["labels"], tf.float32)
    preprocess = hub.KerasLayer(args["preprocessor"], name="preprocessing")
    encoder = hub.KerasLayer(args["encoder"], trainable=True, name="BERT_encoder")
    text_input = tf_keras.layers.Input(shape=(), dtype=tf.string)
    outputs = encoder(preprocess(text_input))
    logit = tf_keras.layers.Dense(1)(tf_keras.layers.Dropout(0.1)(outputs["pooled_output"]))
    model = tf_keras.Model(text_input, logit)
    model.compile(optimizer=tf_keras.optimizers.Adam(args["learning_rate"]),
                  loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))

    inputs = preprocess(texts)
    before = encoder(inputs, training=False)
    again = encoder(inputs, training=False)
    dropout = [encoder(inputs, training=True)["sequence_output"].numpy() for _ in range(2)]
    weights = [w.numpy() for w in encoder.trainable_weights]
    loss_before = model.evaluate(texts, labels, verbose=0)
    model.fit(texts, labels, batch_size=len(args["texts"]), epochs=args["steps"], verbose=0)
    loss_after = model.evaluate(texts, labels, verbose=0)
    seq = before["sequence_output"].numpy()
    print(json.dumps({
        "trainable": [[list(w.shape), float(np.sum(w, dtype=np.float64))] for w in weights],
        "non_trainable": len(encoder.non_trainable_weights),
        "in_model": len(model.trainable_weights),
        "pooled": before["pooled_output"].numpy().tolist(), "sequence": seq.tolist(),
        "default_is_pooled": bool(np.array_equal(before["default"], before["pooled_output"])),
        "encoder_outputs": len(before["encoder_outputs"]),
        "repeatable": bool(np.array_equal(again["sequence_output"], seq)),
        "dropout_vs_inference": float(np.abs(dropout[0] - seq).max()),
        "dropout_vs_dropout": float(np.abs(dropout[0] - dropout[1]).max()),
        "changed": [float(np.abs(w.numpy() - w0).max()) for w, w0 in zip(encoder.trainable_weights, weights)],
        "loss_before": loss_before, "loss_after": loss_after,
    }))
""")


def test_hub_keras_layer_fine_tunes_the_encoder_export_in_a_fresh_process(exports):
    base, encoder = exports["base"], exports["encoder"]
    args = {"texts": SENTENCES, "labels": LABELS, "steps": 40, "learning_rate": 5e-3,
            "preprocessor": str(base / "preprocess_True"), "encoder": str(base / "encoder")}
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS, json.dumps(args)], capture_output=True, text=True,
                            timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])

    # The layer holds the encoder's trainable weights (in order), the seed states as non-trainable ones.
    assert out["trainable"] == [[list(v.shape), float(np.sum(v.numpy(), dtype=np.float64))]
                                for v in encoder.trainable_variables]
    assert out["non_trainable"] == len(encoder.non_trainable_variables) > 0
    assert out["in_model"] == len(encoder.trainable_variables) + 2  # + the Dense head's kernel and bias

    # Before training: the raw-text export's outputs and bert_tf's BertEncoder on FullTokenizer's ids.
    raw = tf.saved_model.load(str(base / "encoder")).signatures["serving_default"](
        text_a=tf.constant(SENTENCES), text_b=tf.constant([""] * len(SENTENCES)))
    full = FullTokenizer(exports["vocab"][True], do_lower_case=True)
    rows = [_round_robin_pack([full.convert_tokens_to_ids(full.tokenize(t))], SEQ, 2, 3) for t in SENTENCES]
    ids, mask, types = (tf.constant(np.array(column), tf.int32) for column in zip(*rows, strict=True))
    direct = encoder({"input_ids": ids, "input_mask": mask, "segment_ids": types}, training=False)
    for name, got in (("pooled_output", out["pooled"]), ("sequence_output", out["sequence"])):
        np.testing.assert_allclose(got, raw[name], rtol=0, atol=TOLERANCE, err_msg=name)
        np.testing.assert_allclose(got, direct[name], rtol=0, atol=TOLERANCE, err_msg=name)
    assert np.ptp(np.array(out["sequence"])[:, 1], axis=0).max() > 0.5  # the sentences get different outputs
    assert out["default_is_pooled"] and out["encoder_outputs"] == SIZES["num_hidden_layers"]

    # training=True turns dropout on (a new mask per call); training=False is repeatable.
    assert out["repeatable"]
    assert out["dropout_vs_inference"] > 0.1 and out["dropout_vs_dropout"] > 0.1

    # fit moves every encoder weight by Adam-sized steps and lowers the loss (0.69 -> 0.04 measured).
    # The attention key biases are the exception: softmax ignores a shift shared by all keys, so their
    # gradient is zero but for rounding.
    frozen = [v.path.endswith("attention/key/bias") for v in encoder.trainable_variables]
    assert sum(frozen) == SIZES["num_hidden_layers"]
    assert [change > 1e-3 for change in out["changed"]] == [not f for f in frozen], out["changed"]
    assert out["loss_after"] < 0.5 * out["loss_before"], (out["loss_before"], out["loss_after"])
