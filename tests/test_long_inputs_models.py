"""A classifier and a tagger trained with windows, once per module: a label only windows can learn, a long
document's output as the aggregation of its windows, and their exports (raw text windowed in the graph, int8)."""

import json

import numpy as np
import pytest
from conftest import TINY_PROB_TOLERANCE, float32_tolerance
from long_inputs import (
    FILLER,
    ROOM,
    SEQ,
    TINY_CONFIG_OVERRIDES,  # noqa: F401  (conftest's tiny_model reads it)
    _doc,
    _long_task_split,
    _run,
    _settings,
    _write_split,
)

from bert_tf.tasks.windows import aggregate_windows, doc_spans_for
from bert_tf.tokenization import FullTokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return FullTokenizer(str(tiny_model / "vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="module")
def windows_model(tiny_model, tmp_path_factory):
    """A classifier trained with --long_inputs=windows (max aggregation, by default clean negatives, then
    calibrated) on the long-document task: (data dir, model dir, dev accuracy)."""
    rng = np.random.default_rng(7)
    data = tmp_path_factory.mktemp("long_task")
    _write_split(data / "train.tsv", _long_task_split(rng, 256))
    _write_split(data / "dev.tsv", _long_task_split(rng, 64))
    out = tmp_path_factory.mktemp("windows_model") / "out"
    results = _run(tiny_model, data, out, do_train=True, do_eval=True, num_train_epochs=20, long_inputs="windows",
                   doc_stride=ROOM, window_aggregation="max")
    return data, out, results["dev"]["eval_accuracy"]


@pytest.mark.slow
def test_label_past_the_first_window_is_chance_truncated_and_learned_with_windows(tiny_model, windows_model,
                                                                                   tmp_path):
    """The falsifiable check: a document of three windows is "yes" when it holds the sentence "want cat !",
    always after its first window (at a random position in its second or third). Truncated, the model never
    sees the evidence and stays at chance; with windows (trained on every window, the max of their logits per
    document) it learns the task; the same model read through its first window only is at chance again.
    Measured with each window alone: truncate 0.48-0.53, windows 0.88-1.00 (0.89-1.00 with the mean), first
    window 0.47-0.56 over data seeds 1-4 and 7. Trained on the aggregate of the max instead: 1.00 at seeds 2, 3
    and 7, 0.50 at 1 and 4. Each window then calibrated: 1.00 at seed 7; clean negatives (max's default now):
    1.00 at seed 7."""
    data, out, windows_accuracy = windows_model
    accuracy = {"windows": windows_accuracy}
    results = _run(tiny_model, data, tmp_path / "truncate", do_train=True, do_eval=True, num_train_epochs=20)
    accuracy["truncate"] = results["dev"]["eval_accuracy"]
    results = _run(tiny_model, data, out, do_eval=True, long_inputs="windows", doc_stride=ROOM,
                   window_aggregation="first")
    accuracy["windows, first window only"] = results["dev"]["eval_accuracy"]
    print("dev accuracy", accuracy)
    # 64 balanced documents: chance is 0.5 with a standard deviation of 0.0625.
    assert accuracy["truncate"] <= 0.65 and accuracy["windows, first window only"] <= 0.65, accuracy
    assert accuracy["windows"] >= 0.8, accuracy


@pytest.mark.slow
def test_long_document_is_the_aggregation_of_its_windows_and_short_ones_are_unchanged(
        tiny_model, tokenizer, windows_model, tmp_path):
    """The trained windows model evaluates and predicts truncated and with windows. The dev documents all fit:
    eval_results.txt is byte-identical. A test document of 3x max_seq_length gets the aggregation of its
    windows' logits, computed here from the model one window at a time; the test documents that fit get the
    truncated run's outputs (up to float32 rounding: they share batches with other rows); one row per input in
    every file."""
    from bert_tf import model_dir
    from bert_tf.runners.common import softmax

    rng = np.random.default_rng(1)
    data = tmp_path / "data"
    data.mkdir()
    _write_split(data / "dev.tsv", [(_doc(rng, 5 + i, 2 if i % 3 else None), "yes" if i % 3 else "no")
                                    for i in range(9)])
    long_doc = _doc(rng, 3 * SEQ, marker_at=40)
    _write_split(data / "test.tsv", [(_doc(rng, 6), ""), (long_doc, ""), (_doc(rng, 10, 2), "")], with_label=False)
    out = windows_model[1]
    _run(tiny_model, data, out, do_eval=True, do_predict=True)
    truncated = {name: (out / name).read_text() for name in ("eval_results.txt", "test_results.tsv")}

    model = model_dir.restore(str(out))
    pieces = tokenizer.tokenize(long_doc)
    assert len(pieces) == 3 * SEQ
    spans = doc_spans_for(len(pieces), SEQ - 2, 6)
    assert len(spans) == 7
    window_logits = []
    for start, length in spans:
        ids = tokenizer.convert_tokens_to_ids(["[CLS]"] + pieces[start:start + length] + ["[SEP]"])
        batch = {"input_ids": np.array([ids], np.int32), "input_mask": np.ones((1, len(ids)), np.int32),
                 "segment_ids": np.zeros((1, len(ids)), np.int32)}
        window_logits.append(np.asarray(model(batch, training=False))[0])
    window_logits = np.array(window_logits, np.float64)
    tolerance = float32_tolerance(10.0, 2 * (32 + 64 + SEQ) + 64)

    for aggregation in ("mean", "max", "logmeanexp", "any", "first"):
        _run(tiny_model, data, out, do_eval=True, do_predict=True, long_inputs="windows", doc_stride=6,
             window_aggregation=aggregation)
        assert (out / "eval_results.txt").read_text() == truncated["eval_results.txt"]
        rows = [np.array(line.split("\t"), float) for line in (out / "test_results.tsv").read_text().splitlines()]
        before = [np.array(line.split("\t"), float) for line in truncated["test_results.tsv"].splitlines()]
        assert len(rows) == len(before) == 3
        assert len((out / "user.tsv").read_text().splitlines()) == 4  # header + one row per input
        np.testing.assert_allclose(rows[0], before[0], atol=tolerance)
        np.testing.assert_allclose(rows[2], before[2], atol=tolerance)
        expected = {"mean": window_logits.mean(0), "max": window_logits.max(0), "first": window_logits[0],
                    "logmeanexp": np.log(np.exp(window_logits).mean(0)),
                    "any": aggregate_windows(window_logits, [0] * len(spans), 1, "any")[0]}
        np.testing.assert_allclose(rows[1], softmax(expected[aggregation]), atol=tolerance)
        if aggregation != "first":  # the later windows count, by more than the tolerance
            assert np.abs(softmax(expected[aggregation]) - softmax(window_logits[0])).max() > 10 * tolerance
        info = json.loads((out / "bert_tf_info.json").read_text())
        assert (info["long_inputs"], info["doc_stride"], info["window_aggregation"]) == ("windows", 6, aggregation)
        # how the model was trained (max's default), kept by evaluation-only runs
        assert info["window_training"] == "clean_negatives"


@pytest.mark.slow
def test_exported_windows_classifier_windows_raw_text_in_the_graph(tiny_model, windows_model, tmp_path):
    """A model directory trained with windows exports a SavedModel whose text signatures cut long texts into the
    same windows and aggregate them as the runner does: its probabilities equal test_results.tsv (float32
    rounding) for texts shorter than a window, of 3x max_seq_length and in between; the metadata records it.
    Two aggregations, one on logits (max) and one on probabilities (any): every aggregation's numbers on the
    export's graph path against the runner's are tests/test_window_aggregation.py's (in-process)."""
    import tensorflow as tf

    from bert_tf.export import export_model_dir

    rng = np.random.default_rng(5)
    data = tmp_path / "data"
    data.mkdir()
    texts = [_doc(rng, 6), _doc(rng, 3 * SEQ, marker_at=30), _doc(rng, 20), _doc(rng, 3 * SEQ), _doc(rng, 14)]
    _write_split(data / "test.tsv", [(text, "") for text in texts], with_label=False)
    out = windows_model[1]
    tolerance = float32_tolerance(10.0, 2 * (32 + 64 + SEQ) + 64)
    for aggregation in ("max", "any"):
        _run(tiny_model, data, out, do_predict=True, long_inputs="windows", doc_stride=5,
             window_aggregation=aggregation)
        expected = np.loadtxt(out / "test_results.tsv", delimiter="\t")
        export = export_model_dir(str(out), str(tmp_path / f"export_{aggregation}"))
        metadata = json.loads((tmp_path / f"export_{aggregation}" / "assets" / "bert_tf_export.json").read_text())
        assert (metadata["long_inputs"], metadata["doc_stride"], metadata["window_aggregation"]) == \
            ("windows", 5, aggregation)
        loaded = tf.saved_model.load(export)
        single = loaded.signatures["serve_text"](text=tf.constant(texts))["probabilities"].numpy()
        default = loaded.signatures["serving_default"](text_a=tf.constant(texts),
                                                       text_b=tf.constant([""] * len(texts)))["probabilities"]
        np.testing.assert_allclose(single, expected, atol=tolerance)
        np.testing.assert_allclose(default.numpy(), expected, atol=tolerance)
        if aggregation == "max":  # the marker past the first window is found: the windows were read
            assert single[1].argmax() == 1 and single[3].argmax() == 0, single


# ------------------------------------------------------------------ the tagger (NER --doc_stride) served with windows
NER_STRIDE = 5


NER_TAGS = {"cat": "B-PER", "dogs": "B-ORG", "unwanted": "B-MISC"}  # dog ##s and un ##want ##ed: several pieces


def _ner_sentence(rng, pieces):
    """Words of exactly `pieces` word pieces: fillers and the tagged words of NER_TAGS."""
    words, left = [], pieces
    while left:
        word = str(rng.choice(FILLER + list(NER_TAGS)))
        size = {"dogs": 2, "unwanted": 3}.get(word, 1)
        if size <= left:
            words.append(word)
            left -= size
    return words


@pytest.fixture(scope="module")
def ner_model(tiny_model, tmp_path_factory):
    """A tagger trained with --doc_stride on sentences of up to two windows, its model dir and the texts to tag:
    one of 3x max_seq_length pieces, one of 20 and two shorter than a window."""
    from bert_tf.runners.ner import NerRunConfig, run

    rng = np.random.default_rng(11)
    data = tmp_path_factory.mktemp("ner_data")
    train = [_ner_sentence(rng, int(rng.integers(3, 2 * ROOM))) for _ in range(64)]
    (data / "train.txt").write_text("\n\n".join("\n".join(f"{w} {NER_TAGS.get(w, 'O')}" for w in s) for s in train)
                                    + "\n")
    texts = [_ner_sentence(rng, 3 * SEQ), _ner_sentence(rng, 5), _ner_sentence(rng, 20), _ner_sentence(rng, ROOM)]
    (data / "test.txt").write_text("\n\n".join("\n".join(s) for s in texts) + "\n")  # words only
    out = tmp_path_factory.mktemp("ner_model") / "out"
    settings = _settings(tiny_model)
    run(NerRunConfig(data_dir=str(data), output_dir=str(out), run=settings, max_seq_length=SEQ,
                     doc_stride=NER_STRIDE, do_train=True, train_batch_size=8, num_train_epochs=3.0))
    run(NerRunConfig(data_dir=str(data), output_dir=str(out), run=settings, max_seq_length=SEQ,
                     doc_stride=NER_STRIDE, do_predict=True))
    return out, texts


@pytest.mark.slow
def test_exported_tagger_tags_each_word_of_a_long_text_in_its_max_context_window(tiny_model, tokenizer, ner_model,
                                                                                 tmp_path):
    """A tagger trained with --doc_stride exports a SavedModel whose serving_default windows the text in the graph
    with the recorded stride: its tags are the runner's test_predictions.txt word for word (a text of 3x
    max_seq_length, one of 20 pieces, shorter ones), and each word's probabilities are those of the window giving
    its first piece the most context, computed here one window at a time (float32 rounding); another window
    holding the word would give other probabilities."""
    import tensorflow as tf

    from bert_tf import model_dir
    from bert_tf.export import export_model_dir
    from bert_tf.tasks.windows import check_is_max_context

    out, texts = ner_model
    export = export_model_dir(str(out), str(tmp_path / "tagger"))
    metadata = json.loads((tmp_path / "tagger" / "assets" / "bert_tf_export.json").read_text())
    assert (metadata["long_inputs"], metadata["doc_stride"], metadata["window_tags"]) == \
        ("windows", NER_STRIDE, "max_context")
    served = tf.saved_model.load(export).signatures["serving_default"](text=tf.constant([" ".join(t) for t in texts]))
    runner = [s.split("\n") for s in (out / "test_predictions.txt").read_text().strip().split("\n\n")]
    assert [len(s) for s in runner] == [len(t) for t in texts]
    assert served["num_words"].numpy().tolist() == [len(t) for t in texts]
    assert served["tags"].shape[1] == len(texts[0]) > SEQ  # as wide as the longest text
    for i, sentence in enumerate(runner):
        assert [line.split()[0] for line in sentence] == texts[i]
        assert [w.decode() for w in served["words"].numpy()[i][:len(texts[i])]] == texts[i]
        assert [t.decode() for t in served["tags"].numpy()[i][:len(texts[i])]] == [line.split()[1] for line in
                                                                                    sentence]
        assert served["tags"].numpy()[i][len(texts[i]):].tolist() == [b""] * (len(texts[0]) - len(texts[i]))

    model = model_dir.restore(str(out))
    labels = json.loads((out / "bert_tf_info.json").read_text())["label_list"]
    probabilities = served["probabilities"].numpy()
    assert probabilities.shape == (len(texts), len(texts[0]), len(labels))
    tolerance = float32_tolerance(10.0, 2 * (32 + 64 + SEQ) + 64)
    pieces = [tokenizer.tokenize(w) for w in texts[0]]
    flat = [p for word in pieces for p in word]
    assert len(flat) == 3 * SEQ
    spans = doc_spans_for(len(flat), ROOM, NER_STRIDE)
    window_probabilities = []
    for start, length in spans:
        ids = tokenizer.convert_tokens_to_ids(["[CLS]"] + flat[start:start + length] + ["[SEP]"])
        batch = {"input_ids": np.array([ids], np.int32), "input_mask": np.ones((1, len(ids)), np.int32),
                 "segment_ids": np.zeros((1, len(ids)), np.int32)}
        logits = np.asarray(model(batch, training=False), np.float64)[0]
        window_probabilities.append(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True))
    first_piece = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    other_windows_differ = 0
    for word, p in enumerate(first_piece):
        holding = [k for k, (start, length) in enumerate(spans) if start <= p < start + length]
        owner = [k for k in holding if check_is_max_context(spans, k, p)]
        assert len(owner) == 1
        expected = window_probabilities[owner[0]][p - spans[owner[0]][0] + 1]
        np.testing.assert_allclose(probabilities[0, word], expected, atol=tolerance)
        for k in holding:
            other = window_probabilities[k][p - spans[k][0] + 1]
            other_windows_differ += k != owner[0] and np.abs(other - expected).max() > 10 * tolerance
    # Which window a word is read in shows (measured: 13 (word, other window) pairs of the 41 words differ).
    assert other_windows_differ >= 5, other_windows_differ
    np.testing.assert_array_equal(probabilities[1, len(texts[1]):], 0.0)


@pytest.mark.slow
def test_exported_tagger_answers_texts_that_fit_as_without_windows(ner_model, tmp_path):
    """Texts shorter than one window: the windowed tagger gives what the tagger without windows (the export of
    the same model dir with windows=None) gives, at today's width of max_seq_length."""
    import tensorflow as tf

    from bert_tf.export import export_model_dir

    out, texts = ner_model
    short = tf.constant([" ".join(texts[1]), " ".join(texts[3]), "", "the cat sat"])
    windowed = tf.saved_model.load(export_model_dir(str(out), str(tmp_path / "windows")))
    plain = tf.saved_model.load(export_model_dir(str(out), str(tmp_path / "plain"), windows=None))
    assert "long_inputs" not in json.loads((tmp_path / "plain" / "assets" / "bert_tf_export.json").read_text())
    got = windowed.signatures["serving_default"](text=short)
    want = plain.signatures["serving_default"](text=short)
    assert set(got) == set(want) == {"words", "tags", "probabilities", "num_words"}
    assert got["tags"].shape[1] == SEQ
    for key in ("words", "tags", "num_words"):
        np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())
    np.testing.assert_allclose(got["probabilities"].numpy(), want["probabilities"].numpy(), atol=1e-6)
    # The one without windows drops the words past its one window; the windowed one tags them all.
    long = tf.constant([" ".join(texts[0])])
    assert plain.signatures["serving_default"](text=long)["num_words"].numpy()[0] < len(texts[0])
    assert windowed.signatures["serving_default"](text=long)["num_words"].numpy()[0] == len(texts[0])


# ------------------------------------------------------------------ int8 with windows
@pytest.mark.slow
def test_int8_exports_with_windows_stay_within_the_int8_bound(windows_model, ner_model, tmp_path):
    """The windowed classifier and tagger exported in int8 answer long and short texts within the bound the
    suite holds non-windowed int8 exports to (tests/test_export_int8.py): probabilities within
    TINY_PROB_TOLERANCE of the float32 windowed export, the same labels and tags."""
    import tensorflow as tf

    from bert_tf.export import export_model_dir

    rng = np.random.default_rng(9)
    out = windows_model[1]
    texts = tf.constant([_doc(rng, 3 * SEQ, marker_at=30), _doc(rng, 6), _doc(rng, 3 * SEQ), _doc(rng, 20, 12)])
    serve = {name: tf.saved_model.load(export_model_dir(str(out), str(tmp_path / f"classifier_{name}"),
                                                        quantize=name)).signatures["serve_text"]
             for name in ("none", "int8")}
    fp32, int8 = (serve[name](text=texts) for name in ("none", "int8"))
    difference = np.abs(int8["probabilities"].numpy() - fp32["probabilities"].numpy()).max()
    print("classifier int8 vs float32, largest probability difference", difference)
    assert 0 < difference < TINY_PROB_TOLERANCE
    np.testing.assert_array_equal(int8["label"].numpy(), fp32["label"].numpy())

    out, ner_texts = ner_model
    texts = tf.constant([" ".join(t) for t in ner_texts])
    serve = {name: tf.saved_model.load(export_model_dir(str(out), str(tmp_path / f"tagger_{name}"),
                                                        quantize=name)).signatures["serving_default"]
             for name in ("none", "int8")}
    fp32, int8 = (serve[name](text=texts) for name in ("none", "int8"))
    assert json.loads((tmp_path / "tagger_int8" / "assets" / "bert_tf_export.json").read_text())["long_inputs"] == \
        "windows"
    difference = np.abs(int8["probabilities"].numpy() - fp32["probabilities"].numpy()).max()
    print("tagger int8 vs float32, largest probability difference", difference)
    assert 0 < difference < TINY_PROB_TOLERANCE
    np.testing.assert_array_equal(int8["tags"].numpy(), fp32["tags"].numpy())
    np.testing.assert_array_equal(int8["num_words"].numpy(), [len(t) for t in ner_texts])
