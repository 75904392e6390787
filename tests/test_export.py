"""Export: in-graph tokenization = FullTokenizer, packing = the original's, and SavedModels that
serve raw text in a fresh process with only tensorflow + tensorflow_text (vocab file gone)."""

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import unicodedata

import numpy as np
import pytest
import tensorflow as tf
from conftest import CPU_ONLY, REPO, TINY_VOCAB, WITHOUT_BERT_TF, run_script, shared_path

from bert_tf.configs import BertConfig, write_run_info
from bert_tf.errors import CheckpointError, ExportError
from bert_tf.export import EXPORT_TYPES, SERVING_MODULES, export_model_dir, export_serving_model
from bert_tf.model_dir import TASK_TYPES, build_task_model
from bert_tf.model_dir import read as read_model_dir
from bert_tf.model_dir import restore as restore_model_dir
from bert_tf.serving.module import pad_positions, used_length
from bert_tf.serving.tokenizer import InGraphTokenizer, pack_pair, truncated_pair_lengths, unicode_differences
from bert_tf.tokenization import BasicTokenizer, FullTokenizer

pytestmark = pytest.mark.slow

HARD_CASES = [
    "UNwant\u00e9d,running",
    " \tHeLLo!how  \n Are yoU?  ",
    "ah\u535a\u63a8zz",
    "a" * 200, "a" * 201, "\u00e9" * 200 + " ok", "\u00e9" * 201,  # the 200-character WordPiece limit
    "\u4e2d" * 250,  # CJK: one word per ideograph, never over the limit
    "\u039f\u0394\u039f\u03a3 \u039f\u0394\u039f\u03a3. \u03a3",  # final sigma
    "\u0130stanbul stra\u00dfe \ufb01ne \u212a",  # special casings
    "a\x0bb c\x1fd e\x85f g\u2028h i\u2029j k\u00a0l m\u3000n",  # controls deleted, odd spaces split
    "\u0301\u0301 q \u200bzero\u200dwidth \ufeffbom \ufffd\x00nul",
    "$5 + <tag> = ^up` | ~x \u00bfqu\u00e9? \u00abhi\u00bb \u2014dash\u2014",
    "\ud55c\uad6d\uc5b4 \u3072\u3089\u304c\u306a \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0939\u093f\u0928\u094d\u0926\u0940",
    "Cr\u00e8me Br\u00fbl\u00e9e caf\u00e9 na\u00efve \u1e9b\u0323",
    "", "   ", "\t\n",
]


def _vocab_for(texts, lower):
    """Specials + every basic word, its halves and a ## suffix: exercises whole words, pieces and [UNK]."""
    basic = BasicTokenizer(do_lower_case=lower)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    seen = set(vocab)
    for i, text in enumerate(texts):
        for j, word in enumerate(basic.tokenize(text)):
            if (i + j) % 5 == 4:
                continue  # leave some words out: [UNK]
            half = max(1, len(word) // 2)
            for piece in (word, word[:half], "##" + word[half:], "##" + word[-1:]):
                if piece not in seen and piece != "##":
                    seen.add(piece)
                    vocab.append(piece)
    return vocab


def _write_vocab(path, tokens):
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return str(path)


def _assert_same_ids(vocab_file, texts, lower):
    expected = FullTokenizer(vocab_file, do_lower_case=lower).encode_batch(texts)
    tok = InGraphTokenizer(vocab_file, do_lower_case=lower)
    got = tok.tokenize(tf.constant([t.encode("utf-8") if isinstance(t, str) else t for t in texts])).to_list()
    bad = [(texts[i][:60], expected[i][:12], got[i][:12]) for i in range(len(texts)) if got[i] != expected[i]]
    assert not bad, f"{len(bad)} of {len(texts)} texts differ, first: {bad[:3]}"


@pytest.mark.parametrize("lower", [True, False])
def test_in_graph_tokenizer_matches_full_tokenizer_on_hard_cases(tmp_path, lower):
    texts = HARD_CASES + ["The cat sat on the mat.", "lowest unwanted"]
    vocab_file = _write_vocab(tmp_path / "vocab.txt", _vocab_for(texts, lower))
    _assert_same_ids(vocab_file, texts, lower)
    assert FullTokenizer(vocab_file, do_lower_case=lower).tokenize("a" * 201) == ["[UNK]"]


def test_in_graph_tokenizers_in_one_process_never_share_a_vocab_table(tmp_path):
    # Regression: a table named after its vocab Asset's repr was shared with a freed tokenizer whose
    # Asset had the same address, so a new tokenizer looked words up in an older vocab (failed one CI
    # run; 7 of 50 builds in alternation before the fix).
    vocabs = [_write_vocab(tmp_path / f"v{i}.txt", ["[PAD]", "[UNK]"] + ["x"] * i + ["hello", "world"])
              for i in range(2)]
    wrong = []
    for step in range(60):
        i = step % 2
        tok = InGraphTokenizer(vocabs[i])
        got = tok.tokenize(tf.constant([b"hello world"])).to_list()[0]
        if got != [2 + i, 3 + i]:
            wrong.append((step, got))
        del tok
    assert not wrong, f"{len(wrong)} of 60 tokenizers used another vocab, first: {wrong[:3]}"


def test_in_graph_tokenizer_drops_invalid_utf8_like_the_original(tmp_path):
    texts = [b"caf\xc3\xa9 \xff\xfebad \xe4\xb8 ok", b"a\xc3b c", b"\xed\xa0\x80x"]
    vocab_file = _write_vocab(tmp_path / "vocab.txt", _vocab_for([t.decode("utf-8", "ignore") for t in texts], True))
    _assert_same_ids(vocab_file, texts, True)


@pytest.mark.parametrize("lower", [True, False])
def test_in_graph_tokenizer_matches_on_xquad(lower):
    vocab_file = str(shared_path("fixtures", "vocab", "bert-base-uncased-vocab.txt"))
    texts = []
    for path in sorted(shared_path("fixtures", "squad", "xquad").glob("xquad.*.json")):
        for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
            for paragraph in article["paragraphs"]:
                texts.append(paragraph["context"])
                texts.extend(qa["question"] for qa in paragraph["qas"])
    assert len(texts) >= 30  # 11 languages, contexts and questions
    _assert_same_ids(vocab_file, texts, lower)


def test_basic_words_match_on_a_code_point_sample(tmp_path):
    """Every code point below U+3400, ICU-patched ones and a stride beyond, inside a word."""
    patched = set(unicode_differences()["lower"]) | set(unicode_differences()["nfd"])
    cps = sorted({*range(1, 0x3400), *(ord(c) for c in patched), *range(0x3400, 0x110000, 61)} - set(range(0xD800, 0xE000)))
    texts = [f"Ab{chr(cp)}\u0301C{chr(cp)}" for cp in cps]
    vocab_file = _write_vocab(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    for lower in (True, False):
        basic = BasicTokenizer(do_lower_case=lower)
        words = InGraphTokenizer(vocab_file, do_lower_case=lower).words(tf.constant([t.encode() for t in texts]))
        got = [[w.decode("utf-8") for w in row] for row in words.to_list()]
        bad = [(hex(cp), g, basic.tokenize(t)) for cp, t, g in zip(cps, texts, got, strict=True)
               if g != basic.tokenize(t)]
        assert not bad, f"lower={lower}: {len(bad)} code points differ, first {bad[:5]}"


def _truncate_like_the_original(len_a, len_b, budget):
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def test_truncation_is_the_originals_longest_first():
    rng = random.Random(0)
    cases = [(rng.randrange(0, 40), rng.randrange(0, 40), rng.randrange(1, 30)) for _ in range(500)]
    cases += [(5, 5, 5), (6, 5, 5), (5, 6, 5), (0, 9, 4), (9, 0, 4), (3, 3, 6)]
    a, b, m = (np.array(x) for x in zip(*cases, strict=True))
    got_a, got_b = truncated_pair_lengths(tf.constant(a), tf.constant(b), tf.constant(m))
    expected = [_truncate_like_the_original(*c) for c in cases]
    assert list(zip(got_a.numpy().tolist(), got_b.numpy().tolist(), strict=True)) == expected


def test_pack_pair_layout():
    ids_a = tf.ragged.constant([[5, 6, 7, 8, 9], [5], [5, 6], []], dtype=tf.int64)
    ids_b = tf.ragged.constant([[11, 12, 13], [], [7] * 6, []], dtype=tf.int64)
    out = {k: v.numpy().tolist() for k, v in pack_pair(ids_a, ids_b, 8, 101, 102).items()}
    assert out["input_word_ids"] == [[101, 5, 6, 7, 102, 11, 12, 102], [101, 5, 102, 0, 0, 0, 0, 0],
                                     [101, 5, 6, 102, 7, 7, 7, 102], [101, 102, 0, 0, 0, 0, 0, 0]]
    assert out["input_type_ids"] == [[0, 0, 0, 0, 0, 1, 1, 1], [0] * 8, [0, 0, 0, 0, 1, 1, 1, 1], [0] * 8]
    assert out["input_mask"] == [[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0], [1] * 8, [1, 1, 0, 0, 0, 0, 0, 0]]


# ------------------------------------------------------------------ exported models
SEQ = 16
LABELS = ["contradiction", "entailment", "neutral"]
TEXTS_A = ["The cat sat on the mat.", "HELLO, how are you?", "unwanted running dog", "a " * 30]
TEXTS_B = ["", "The dog sat.", "lowest", "the mat " * 20]


def _tiny_config():
    return BertConfig(vocab_size=len(TINY_VOCAB), hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=16, max_position_embeddings=32)


def _make_model_dir(folder, info):
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    config = _tiny_config()
    config.to_json_file(str(folder / "bert_config.json"))
    write_run_info(str(folder), **info)
    keras_model = build_task_model(config, info)
    # Non-trivial head weights so that probabilities differ between texts.
    rng = np.random.default_rng(0)
    encoder_ids = {id(v) for v in keras_model.encoder.trainable_variables}
    for v in keras_model.trainable_variables:
        scale = 1.0 if id(v) in encoder_ids else 2.0
        v.assign(rng.normal(0.0, scale, v.shape).astype("float32"))
    optimizer_state = tf.Variable(7, dtype=tf.int64)  # stands in for the optimizer's slots
    tf.train.Checkpoint(model=keras_model, step=optimizer_state).write(str(folder / "ckpt-5"))
    return keras_model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    info = dict(do_lower_case=True, max_seq_length=SEQ, task_type="classification", label_list=LABELS)
    model = _make_model_dir(base / "model_dir", info)
    export_model_dir(str(base / "model_dir"), str(base / "classifier"))
    export_model_dir(str(base / "model_dir"), str(base / "encoder"), export_type="encoder")
    return {"base": base, "model": model}


def _python_features(vocab_file, texts_a, texts_b, seq):
    tok = FullTokenizer(vocab_file, do_lower_case=True)
    rows = {"input_ids": [], "input_mask": [], "segment_ids": []}
    for a, b in zip(texts_a, texts_b, strict=True):
        ta, tb = tok.tokenize(a), tok.tokenize(b)
        if tb:
            la, lb = _truncate_like_the_original(len(ta), len(tb), seq - 3)
            ta, tb = ta[:la], tb[:lb]
        else:
            ta = ta[:seq - 2]
        tokens = ["[CLS]"] + ta + ["[SEP]"] + (tb + ["[SEP]"] if tb else [])
        types = [0] * (len(ta) + 2) + [1] * (len(tb) + 1 if tb else 0)
        ids = tok.convert_tokens_to_ids(tokens)
        pad = seq - len(ids)
        rows["input_ids"].append(ids + [0] * pad)
        rows["input_mask"].append([1] * len(ids) + [0] * pad)
        rows["segment_ids"].append(types + [0] * pad)
    return {k: tf.constant(v, tf.int32) for k, v in rows.items()}


FRESH_PROCESS = WITHOUT_BERT_TF + textwrap.dedent("""
    loaded = tf.saved_model.load(sys.argv[1])
    texts = json.loads(sys.argv[2])
    out = loaded.signatures["serving_default"](text_a=tf.constant(texts["a"]), text_b=tf.constant(texts["b"]))
    assert "bert_tf" not in sys.modules
    print(json.dumps({"probabilities": out["probabilities"].numpy().tolist(),
                      "label": [x.decode() for x in out["label"].numpy()]}))
""")


def test_classifier_serves_raw_text_in_a_fresh_process_without_vocab_or_bert_tf(exported):
    base = exported["base"]
    vocab_file = str(base / "model_dir" / "vocab.txt")
    features = _python_features(vocab_file, TEXTS_A, TEXTS_B, SEQ)
    logits = exported["model"](features, training=False)
    expected = tf.nn.softmax(logits, axis=-1).numpy()
    assert np.ptp(expected, axis=0).max() > 1e-2  # the texts get different answers

    # A copy of the export alone, the model_dir and its vocab moved away.
    moved = base / "moved_model_dir"
    shutil.move(str(base / "model_dir"), str(moved))
    try:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        result = subprocess.run(
            [sys.executable, "-c", FRESH_PROCESS, str(base / "classifier"), json.dumps({"a": TEXTS_A, "b": TEXTS_B})],
            capture_output=True, text=True, env=env, cwd=str(base), timeout=300)
    finally:
        shutil.move(str(moved), str(base / "model_dir"))
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(out["probabilities"], expected, atol=1e-5)
    assert out["label"] == [LABELS[i] for i in expected.argmax(axis=1)]


def test_ids_signature_and_preprocess_match_the_python_features(exported):
    loaded = tf.saved_model.load(str(exported["base"] / "classifier"))
    features = _python_features(str(exported["base"] / "model_dir" / "vocab.txt"), TEXTS_A, TEXTS_B, SEQ)
    packed = loaded.signatures["preprocess"](text_a=tf.constant(TEXTS_A), text_b=tf.constant(TEXTS_B))
    np.testing.assert_array_equal(packed["input_word_ids"], features["input_ids"])
    np.testing.assert_array_equal(packed["input_mask"], features["input_mask"])
    np.testing.assert_array_equal(packed["input_type_ids"], features["segment_ids"])
    by_ids = loaded.signatures["serve_ids"](**packed)
    by_text = loaded.signatures["serving_default"](text_a=tf.constant(TEXTS_A), text_b=tf.constant(TEXTS_B))
    np.testing.assert_allclose(by_ids["probabilities"], by_text["probabilities"], atol=1e-6)
    single = loaded.signatures["serve_text"](text=tf.constant(TEXTS_A[:1]))
    np.testing.assert_allclose(single["probabilities"], by_text["probabilities"][:1], atol=1e-6)
    names = loaded.signatures["serve_ids"].structured_input_signature[1]
    assert {k: (v.dtype, v.shape.as_list()) for k, v in names.items()} == {
        k: (tf.int32, [None, None]) for k in ("input_word_ids", "input_mask", "input_type_ids")}


def test_used_length_is_one_past_the_last_position_any_row_uses():
    assert int(used_length(tf.constant([[1, 1, 0, 0], [1, 0, 0, 0]]))) == 2
    assert int(used_length(tf.constant([[0, 1, 0, 0]]))) == 2  # a mask that is not a prefix
    assert int(used_length(tf.constant([[[1, 0, 0], [1, 1, 1]], [[1, 0, 0], [0, 0, 0]]]))) == 3  # [B, C, S]
    assert int(used_length(tf.zeros([2, 5], tf.int32))) == 1
    padded = pad_positions(tf.ones([2, 3, 4]), 5).numpy()
    assert padded.shape == (2, 5, 4) and padded[:, :3].min() == 1 and padded[:, 3:].max() == 0


def test_texts_shorter_than_max_seq_length_get_the_full_length_outputs(exported):
    """The model runs on the positions a batch uses only (ServingModule._model): each text alone and
    a batch of the short ones give the same tokens and the same probabilities (to float32 rounding)
    as the model on all SEQ positions; the encoder's outputs at the positions it skipped are 0."""
    base = exported["base"]
    features = _python_features(str(base / "model_dir" / "vocab.txt"), TEXTS_A, TEXTS_B, SEQ)
    lengths = features["input_mask"].numpy().sum(axis=1)
    short = [i for i in range(len(TEXTS_A)) if lengths[i] < SEQ]
    assert len(short) >= 2 and min(lengths) < SEQ - 4  # the trimmed path is what is tested
    expected = tf.nn.softmax(exported["model"](features, training=False), axis=-1).numpy()
    classifier = tf.saved_model.load(str(base / "classifier"))
    for rows in [[i] for i in range(len(TEXTS_A))] + [short]:
        a, b = tf.constant([TEXTS_A[i] for i in rows]), tf.constant([TEXTS_B[i] for i in rows])
        packed = classifier.signatures["preprocess"](text_a=a, text_b=b)
        np.testing.assert_array_equal(packed["input_word_ids"], tf.gather(features["input_ids"], rows))
        out = classifier.signatures["serving_default"](text_a=a, text_b=b)
        np.testing.assert_allclose(out["probabilities"], expected[rows], rtol=0, atol=1e-6)
        assert [x.decode() for x in out["label"].numpy()] == [LABELS[j] for j in expected[rows].argmax(axis=1)]
    encoder = tf.saved_model.load(str(base / "encoder"))
    full = exported["model"].encoder(features, training=False)
    for i in short:
        n = int(lengths[i])
        out = encoder.signatures["serving_default"](text_a=tf.constant([TEXTS_A[i]]), text_b=tf.constant([TEXTS_B[i]]))
        assert out["sequence_output"].shape == (1, SEQ, _tiny_config().hidden_size)
        np.testing.assert_allclose(out["sequence_output"][0, :n], full["sequence_output"][i, :n], atol=1e-5)
        np.testing.assert_allclose(out["encoder_outputs"][0, :n], full["encoder_outputs"][0][i, :n], atol=1e-5)
        assert np.abs(out["sequence_output"][0, n:]).max() == 0
        np.testing.assert_allclose(out["pooled_output"][0], full["pooled_output"][i], atol=1e-5)


def test_metadata_asset_describes_the_export(exported):
    meta = json.loads((exported["base"] / "classifier" / "assets" / "bert_tf_export.json").read_text("utf-8"))
    assert meta["export_type"] == "classification" and meta["label_list"] == LABELS
    assert meta["max_seq_length"] == SEQ and meta["tokenizer"]["do_lower_case"] is True
    assert meta["tokenizer"]["python_unicode_version"] == unicodedata.unidata_version
    assert meta["tokenizer"]["differences_from_fulltokenizer"]
    vocab = (exported["base"] / "classifier" / "assets" / "vocab.txt").read_text("utf-8").split("\n")[:-1]
    assert vocab == TINY_VOCAB


def test_encoder_export_has_tf_hub_names_and_reproduces_the_encoder(exported):
    loaded = tf.saved_model.load(str(exported["base"] / "encoder"))
    serve_ids = loaded.signatures["serve_ids"]
    assert set(serve_ids.structured_input_signature[1]) == {"input_word_ids", "input_mask", "input_type_ids"}
    assert set(serve_ids.structured_outputs) == {"pooled_output", "sequence_output", "encoder_outputs",
                                                 "encoder_outputs_1"}
    features = _python_features(str(exported["base"] / "model_dir" / "vocab.txt"), TEXTS_A, TEXTS_B, SEQ)
    expected = exported["model"].encoder(features, training=False)
    out = loaded.signatures["serving_default"](text_a=tf.constant(TEXTS_A), text_b=tf.constant(TEXTS_B))
    np.testing.assert_allclose(out["sequence_output"], expected["sequence_output"], atol=1e-5)
    np.testing.assert_allclose(out["pooled_output"], expected["pooled_output"], atol=1e-5)
    np.testing.assert_allclose(out["encoder_outputs"], expected["encoder_outputs"][0], atol=1e-5)
    hub = loaded({"input_word_ids": features["input_ids"], "input_mask": features["input_mask"],
                  "input_type_ids": features["segment_ids"]})
    assert len(hub["encoder_outputs"]) == 2
    np.testing.assert_allclose(hub["pooled_output"], expected["pooled_output"], atol=1e-5)


def test_every_task_type_but_pretraining_has_one_serving_module():
    assert set(EXPORT_TYPES) == {"encoder"} | set(TASK_TYPES) - {"pretraining"}
    assert len({module.__module__ for module in SERVING_MODULES.values()}) == 5  # regression shares classifier's
    assert [t for t, module in SERVING_MODULES.items() if module.serves_encoder] == ["encoder"]


def test_multiple_choice_and_regression_exports_reproduce_their_models(tmp_path):
    choices = [["the cat sat.", "the dog sat.", "hello!"], ["on the mat", "how are you?", "lowest"]]
    contexts = ["the cat sat on the mat.", "how are you?"]
    model = _make_model_dir(tmp_path / "swag_dir", dict(do_lower_case=True, max_seq_length=SEQ,
                                                         task_type="multiple_choice", num_choices=3))
    export_model_dir(str(tmp_path / "swag_dir"), str(tmp_path / "swag"))
    loaded = tf.saved_model.load(str(tmp_path / "swag"))
    out = loaded.signatures["serving_default"](context=tf.constant(contexts), choices=tf.constant(choices))
    vocab = str(tmp_path / "swag_dir" / "vocab.txt")
    flat = _python_features(vocab, [c for c in contexts for _ in range(3)], sum(choices, []), SEQ)
    expected = model({k: tf.reshape(v, (2, 3, SEQ)) for k, v in flat.items()}).numpy()  # [B, C]
    np.testing.assert_allclose(out["logits"], expected, atol=1e-5)
    np.testing.assert_array_equal(out["choice"], expected.argmax(-1))
    assert np.ptp(out["probabilities"].numpy()) > 0.05  # the choices get different scores

    model = _make_model_dir(tmp_path / "sts_dir", dict(do_lower_case=True, max_seq_length=SEQ,
                                                       task_type="regression"))
    export_model_dir(str(tmp_path / "sts_dir"), str(tmp_path / "sts"))
    out = tf.saved_model.load(str(tmp_path / "sts")).signatures["serving_default"](
        text_a=tf.constant(TEXTS_A), text_b=tf.constant(TEXTS_B))
    assert set(out) == {"score"}
    expected = model(_python_features(str(tmp_path / "sts_dir" / "vocab.txt"), TEXTS_A, TEXTS_B, SEQ))
    np.testing.assert_allclose(out["score"], expected.numpy()[:, 0], atol=1e-5)


@pytest.mark.parametrize("export_type,options,message", [
    ("pretraining", {}, "task_type 'pretraining' cannot be exported; expected one of encoder, classification"),
    ("classification", {}, "classification export needs a label_list"),
    ("tagging", {}, "tagging export needs a label_list"),
    ("multiple_choice", {}, "multiple_choice export needs num_choices >= 2, got None"),
    ("span", dict(max_query_length=14), "max_seq_length 16 leaves no room for a context after max_query_length 14"),
])
def test_options_a_serving_module_cannot_use_give_one_line_errors(exported, tmp_path, export_type, options,
                                                                    message):
    with pytest.raises(ExportError) as info:
        export_serving_model(exported["model"], export_type, str(tmp_path / "out"), str(exported["base"] / "model_dir" / "vocab.txt"),
                             do_lower_case=True, max_seq_length=SEQ, **options)
    assert str(info.value).startswith(message)
    assert not (tmp_path / "out").exists()


def test_restore_model_dir_returns_the_trained_weights(exported):
    restored = restore_model_dir(str(exported["base"] / "model_dir"))
    for a, b in zip(restored.weights, exported["model"].weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_bad_model_dirs_and_export_dirs_give_one_line_errors(exported, tmp_path):
    base = exported["base"]
    with pytest.raises(CheckpointError, match="model_dir not found"):
        read_model_dir(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "bert_config.json").write_text(_tiny_config().to_json_string())
    write_run_info(str(empty), do_lower_case=True, max_seq_length=SEQ, task_type="classification", label_list=LABELS)
    with pytest.raises(CheckpointError, match="no ckpt-<step> checkpoint"):
        restore_model_dir(str(empty))
    with pytest.raises(CheckpointError, match="label_list"):
        build_task_model(_tiny_config(), {"task_type": "tagging"})
    keep = base / "classifier" / "saved_model.pb"
    before = keep.stat().st_mtime_ns
    with pytest.raises(ExportError, match="not empty; pass --overwrite"):
        export_model_dir(str(base / "model_dir"), str(base / "classifier"))
    assert keep.stat().st_mtime_ns == before

    result = run_script("export_savedmodel.py", f"--model_dir={base / 'model_dir'}",
                        f"--export_dir={base / 'classifier'}", timeout=300)
    assert result.returncode != 0
    # (TensorFlow's own start-up lines, e.g. about a missing CUDA driver, are not ours.)
    errors = [line for line in result.stderr.splitlines() if "export_savedmodel.py" in line or "Traceback" in line]
    assert errors == [f"export_savedmodel.py: error: {base / 'classifier'}: export_dir exists and is not empty; "
                      "pass --overwrite to replace it"]


def test_checkpoint_export_refuses_a_vocab_that_does_not_fit_the_checkpoint(exported, tmp_path):
    from bert_tf.export import export_checkpoint

    model_dir = exported["base"] / "model_dir"
    for tokens in (TINY_VOCAB[:-3], TINY_VOCAB + ["extra"]):  # fewer entries than its embeddings, and more
        other = tmp_path / "other_vocab.txt"
        other.write_text("\n".join(tokens) + "\n", encoding="utf-8")
        for export_type in ("encoder", "preprocessor"):
            with pytest.raises(ExportError) as info:
                export_checkpoint(str(model_dir), None, str(other), True, str(tmp_path / "export"), SEQ,
                                  export_type=export_type)
            assert str(info.value).startswith(f"{other}: {len(tokens)} tokens but {model_dir / 'ckpt-5'} has "
                                              f"vocab_size {len(TINY_VOCAB)}; ")
            assert not (tmp_path / "export").exists()


def _parse_saved_model_cli(text):
    """`saved_model_cli show --all` -> {signature: {"inputs"|"outputs": {name: (dtype, shape)}}}."""
    signatures, current, side, name = {}, None, None, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("signature_def['"):
            current = signatures.setdefault(line.split("'")[1], {"inputs": {}, "outputs": {}})
        elif line.startswith("The given SavedModel SignatureDef contains the following input"):
            side = "inputs"
        elif line.startswith("The given SavedModel SignatureDef contains the following output"):
            side = "outputs"
        elif current is not None and (line.startswith("inputs['") or line.startswith("outputs['")):
            name = line.split("'")[1]
        elif line.startswith("dtype: ") and name:
            dtype = line.split(": ", 1)[1]
        elif line.startswith("shape: ") and name:
            current[side][name] = (dtype, line.split(": ", 1)[1])
            name = None
    return signatures


def test_saved_model_cli_lists_the_signatures_with_names_dtypes_and_shapes(exported):
    """What a TF Serving user sees: the tool reads the export on its own (no bert_tf involved)."""
    result = subprocess.run(
        [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli", "show", "--all",
         "--dir", str(exported["base"] / "classifier")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    found = _parse_saved_model_cli(result.stdout)
    text_in = {"text_a": ("DT_STRING", "(-1)"), "text_b": ("DT_STRING", "(-1)")}
    answers = {"probabilities": ("DT_FLOAT", f"(-1, {len(LABELS)})"), "logits": ("DT_FLOAT", f"(-1, {len(LABELS)})"),
               "label": ("DT_STRING", "(-1)"), "label_id": ("DT_INT64", "(-1)")}
    hub_ids = {k: ("DT_INT32", "(-1, -1)") for k in ("input_word_ids", "input_mask", "input_type_ids")}
    assert found["serving_default"] == {"inputs": text_in, "outputs": answers}
    assert found["serve_ids"] == {"inputs": hub_ids, "outputs": answers}
    assert found["preprocess"] == {
        "inputs": text_in, "outputs": {k: ("DT_INT32", f"(-1, {SEQ})") for k in hub_ids}}
    assert found["serve_text"] == {"inputs": {"text": ("DT_STRING", "(-1)")}, "outputs": answers}
    assert "Method name is: tensorflow/serving/predict" in result.stdout


def test_runner_export_dir_serves_what_the_runner_predicted(tmp_path):
    """run_classifier.py --export_dir: the export's probabilities on raw test sentences are the runner's own
    test_results.tsv; a second run into the now non-empty export_dir stops before training."""
    data = REPO / "tests" / "testdata" / "classifier"
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    BertConfig(vocab_size=len(TINY_VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=32).to_json_file(str(model / "bert_config.json"))
    out, export_dir = tmp_path / "out", tmp_path / "serving" / "bert" / "1"

    def run(output_dir):
        return run_script(
            "run_classifier.py", "--task_name=user", f"--data_dir={data}", "--index_column=id",
            f"--vocab_file={model / 'vocab.txt'}", f"--bert_config_file={model / 'bert_config.json'}",
            f"--output_dir={output_dir}", f"--export_dir={export_dir}", "--max_seq_length=16", "--train_batch_size=8",
            "--do_train", "--do_predict", "--num_train_epochs=1", "--learning_rate=1e-3", env=CPU_ONLY)

    import tensorflow_text  # noqa: F401  (registers the tokenizer ops the export uses)

    result = run(out)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = np.loadtxt(out / "test_results.tsv", delimiter="\t")  # [6, 2]
    sentences = [line.split("\t")[1] for line in (data / "test.tsv").read_text("utf-8").splitlines()[1:]]
    loaded = tf.saved_model.load(str(export_dir))
    got = loaded.signatures["serving_default"](text_a=tf.constant(sentences), text_b=tf.constant([""] * len(sentences)))
    np.testing.assert_allclose(got["probabilities"], expected, atol=1e-5)
    assert [x.decode() for x in got["label"].numpy()] == [["no", "yes"][i] for i in expected.argmax(axis=1)]

    second = run(tmp_path / "out2")
    assert second.returncode != 0
    assert second.stderr.strip().splitlines()[-1] == (
        f"error: {export_dir}: --export_dir exists and is not empty; pass a new folder (e.g. the next version number)")
    assert not (tmp_path / "out2").exists()
