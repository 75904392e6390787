"""predict.py on exported span (SQuAD) and tagging (NER) models, and their serving outputs."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, tiny_task_model_dir

from bert_tf.export import export_model_dir
from bert_tf.tokenization import FullTokenizer

pytestmark = pytest.mark.slow

SEQ = 24
TAGS = ["O", "B-PER", "I-PER"]


def _model_dir(folder, info):
    return tiny_task_model_dir(folder, info, seq=SEQ, hidden=8, layers=1, weight_sd=1.0, seed=1)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    base = tmp_path_factory.mktemp("predict")
    models = {
        "span": _model_dir(base / "span_dir", {"task_type": "span", "max_query_length": 6}),
        "tagging": _model_dir(base / "tag_dir", {"task_type": "tagging", "label_list": TAGS}),
    }
    export_model_dir(str(base / "span_dir"), str(base / "span"), max_answer_length=4)
    export_model_dir(str(base / "tag_dir"), str(base / "tagging"))
    return base, models


def _predict(*args):
    result = subprocess.run([sys.executable, str(REPO / "predict.py"), *args], capture_output=True, text=True,
                            timeout=300)
    return result.returncode, result.stdout, [line for line in result.stderr.splitlines() if "predict.py" in line]


def test_span_answer_is_the_best_allowed_span_of_the_context(exports):
    base, models = exports
    loaded = tf.saved_model.load(str(base / "span"))
    question = ["how are you ? the cat sat on the mat"]  # 10 pieces: cut to max_query_length 6
    context = ["the dog sat on a mat . the cat sat ."]
    out = loaded.signatures["serving_default"](question=tf.constant(question), context=tf.constant(context))
    packed = loaded.signatures["preprocess"](question=tf.constant(question), context=tf.constant(context))
    tok = FullTokenizer(str(base / "span_dir" / "vocab.txt"))
    q, c = tok.tokenize(question[0])[:6], tok.tokenize(context[0])
    expected_ids = tok.convert_tokens_to_ids(["[CLS]"] + q + ["[SEP]"] + c + ["[SEP]"])
    assert packed["input_word_ids"].numpy()[0, :len(expected_ids)].tolist() == expected_ids

    logits = models["span"]({"input_ids": packed["input_word_ids"], "input_mask": packed["input_mask"],
                             "segment_ids": packed["input_type_ids"]})
    start, end = logits["start_logits"].numpy()[0], logits["end_logits"].numpy()[0]
    first = len(q) + 2
    best = max(((s, e) for s in range(first, first + len(c)) for e in range(s, min(s + 4, first + len(c)))),
               key=lambda se: start[se[0]] + end[se[1]])
    assert (int(out["answer_start"][0]), int(out["answer_end"][0])) == best
    pieces = tok.convert_ids_to_tokens(expected_ids[best[0]:best[1] + 1])
    assert out["answer_text"].numpy()[0].decode() == " ".join(pieces).replace(" ##", "")
    np.testing.assert_allclose(out["answer_score"][0], start[best[0]] + end[best[1]], rtol=1e-5)


def test_tagging_gives_one_tag_per_word_from_its_first_piece(exports):
    base, models = exports
    loaded = tf.saved_model.load(str(base / "tagging"))
    text = ["unwanted cats sat, lowest", "hello"]
    out = loaded.signatures["serving_default"](text=tf.constant(text))
    assert out["num_words"].numpy().tolist() == [5, 1]
    words = [w.decode() for w in out["words"].numpy()[0][:5]]
    assert words == ["unwanted", "cats", "sat", ",", "lowest"]
    packed = loaded.signatures["preprocess"](text=tf.constant(text))
    logits = models["tagging"]({"input_ids": packed["input_word_ids"], "input_mask": packed["input_mask"],
                                "segment_ids": packed["input_type_ids"]}).numpy()
    # unwanted = un ##want ##ed (pieces 1-3), cats = cat ##s (4-5), sat (6), "," (7), lowest (8)
    firsts = [1, 4, 6, 7, 8]
    expected = [TAGS[i] for i in logits[0, firsts].argmax(axis=-1)]
    assert [t.decode() for t in out["tags"].numpy()[0][:5]] == expected
    assert out["tags"].numpy()[0][5:].tolist() == [b""] * (SEQ - 5)


def test_predict_cli_answers_from_a_file_and_the_command_line(exports, tmp_path):
    base, _ = exports
    inputs = tmp_path / "texts.txt"
    inputs.write_text("the cat sat\n\nhello how are you\n", encoding="utf-8")
    code, stdout, errors = _predict(f"--export_dir={base / 'tagging'}", f"--input_file={inputs}", "--format=json")
    assert code == 0, errors
    rows = [json.loads(line) for line in stdout.strip().splitlines()]
    assert [r["words"] for r in rows] == [["the", "cat", "sat"], ["hello", "how", "are", "you"]]
    assert all(t in TAGS for r in rows for t in r["tags"])

    loaded = tf.saved_model.load(str(base / "span"))
    expected = loaded.signatures["serving_default"](question=tf.constant(["who sat ?"]),
                                                   context=tf.constant(["the cat sat on the mat ."]))
    code, stdout, errors = _predict(f"--export_dir={base / 'span'}", "--text=who sat ?",
                                    "--text_b=the cat sat on the mat .")
    assert code == 0, errors
    fields = stdout.strip().split("\t")
    assert fields[:3] == ["who sat ?", "the cat sat on the mat .", expected["answer_text"].numpy()[0].decode()]


def test_predict_cli_bad_input_is_one_line(exports, tmp_path):
    code, _, errors = _predict(f"--export_dir={tmp_path / 'nothing'}", "--text=hi")
    assert code != 0
    assert errors == [f"predict.py: error: {tmp_path / 'nothing'}: not a SavedModel or ONNX export written by export_savedmodel.py"]
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\tc\n", encoding="utf-8")
    code, _, errors = _predict(f"--export_dir={exports[0] / 'span'}", f"--input_file={bad}")
    assert code != 0
    assert errors == [f"predict.py: error: {bad}:1: expected text or text<TAB>text_b, got 3 columns"]
