"""GLUE / XNLI / user TSV-CSV classification data, features, metrics and output files (bert_tf.tasks.glue)."""

import math

import numpy as np
import pytest
from conftest import TESTDATA, TINY_VOCAB, shared_path

from bert_tf.errors import InputDataError
from bert_tf.tasks import glue, metrics
from bert_tf.tokenization import FullTokenizer

# GLUE folder, task name, labelled splits, test splits.
GLUE = [
    ("CoLA", "cola", ["train", "dev"], ["test"]),
    ("SST-2", "sst-2", ["train", "dev"], ["test"]),
    ("MRPC", "mrpc", ["train", "dev"], []),  # the fixture has no MRPC test.tsv
    ("STS-B", "sts-b", ["train", "dev"], ["test"]),
    ("QQP", "qqp", ["train", "dev"], ["test"]),
    ("MNLI", "mnli", ["train", "dev_matched", "dev_mismatched"], ["test_matched", "test_mismatched"]),
    ("MNLI", "mnli-mm", ["dev"], ["test"]),
    ("QNLI", "qnli", ["train", "dev"], ["test"]),
    ("RTE", "rte", ["train", "dev"], ["test"]),
    ("WNLI", "wnli", ["train", "dev"], ["test"]),
    ("AX", "ax", [], ["test"]),
]


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    return FullTokenizer(str(path), do_lower_case=True)


@pytest.fixture(scope="module")
def real_tokenizer():
    return FullTokenizer(str(shared_path("fixtures", "vocab", "bert-base-uncased-vocab.txt")), do_lower_case=True)


# ----------------------------------------------------------------- real GLUE layouts
@pytest.mark.parametrize("folder, name, labelled, tests", GLUE, ids=[g[1] for g in GLUE])
def test_every_glue_task_reads_the_real_layout(folder, name, labelled, tests, real_tokenizer):
    data_dir = str(shared_path("fixtures", "glue", folder))
    spec = glue.get_task(name)
    for split in labelled:
        examples = spec.read_examples(data_dir, split)
        assert examples and all(e.text_a.strip() for e in examples)
        if spec.is_regression:
            assert all(isinstance(e.label, float) and 0.0 <= e.label <= 5.0 for e in examples)
        else:
            assert all(e.label in spec.labels for e in examples)
        pair = spec.split(split).layout.text_b is not None
        assert all((e.text_b is not None) == pair for e in examples)
        features = glue.convert_examples_to_features(examples, spec.labels, 64, real_tokenizer)
        for f, e in zip(features, examples, strict=True):
            assert f.input_ids[0] == 101 and f.input_ids[-1] == 102 and len(f.input_ids) <= 64
            assert f.input_ids.count(102) == (2 if pair else 1)
            assert f.label_id == (e.label if spec.is_regression else spec.labels.index(e.label))
    for split in tests:
        examples = spec.read_examples(data_dir, split)
        assert examples and all(e.label is None and e.index is not None for e in examples)
        assert spec.split(split).submission


def test_known_rows_of_real_files():
    glue_dir = shared_path("fixtures", "glue")
    mrpc = glue.get_task("mrpc").read_examples(str(glue_dir / "MRPC"), "train")
    # The BOM before "Quality" is dropped, and '"' is plain text in GLUE TSVs.
    assert mrpc[0].label == "1" and mrpc[0].text_b.startswith('" The foodservice pie business')
    cola = glue.get_task("cola").read_examples(str(glue_dir / "CoLA"), "train")
    assert cola[0].text_a.startswith("Our friends won't buy this analysis") and cola[0].label == "1"
    stsb = glue.get_task("sts-b").read_examples(str(glue_dir / "STS-B"), "train")
    assert stsb[1].label == 3.8
    qqp = glue.get_task("qqp").read_examples(str(glue_dir / "QQP"), "test")
    assert qqp[0].index == "0"


# ----------------------------------------------------------------- our own fixtures
def test_user_csv_task_with_quotes_and_inferred_numeric_labels():
    spec = glue.user_task(text_a="review", label="stars", index="id", file_format="csv")
    spec = glue.infer_labels(spec, str(TESTDATA / "user_csv"))
    assert spec.labels == ("1", "3", "5", "10")  # numeric order, not string order
    train = spec.read_examples(str(TESTDATA / "user_csv"), "train")
    assert [e.text_a for e in train[:3]] == ["Great cat, great mat.", "The dog sat on the cat.", '"Fine", said the cat.']
    test = spec.read_examples(str(TESTDATA / "user_csv"), "test")
    assert test[0].label is None and test[0].index == "t1" and test[0].text_a == "Hello, cat."
    regression = glue.user_task(text_a="review", label="stars", regression=True, file_format="csv")
    dev = regression.read_examples(str(TESTDATA / "user_csv"), "dev")
    assert [e.label for e in dev] == [5.0, 1.0] and regression.num_labels == 1
    assert regression.metric == "pearson_spearman"


def test_xnli_language_filter_and_label_map():
    spec = glue.get_task("XNLI", xnli_language="zh")
    train = spec.read_examples(str(TESTDATA / "xnli"), "train")
    assert [e.label for e in train] == ["entailment", "contradiction", "neutral"]
    dev = spec.read_examples(str(TESTDATA / "xnli"), "dev")
    assert [(e.text_a, e.label) for e in dev] == [("猫坐着。", "entailment"), ("狗跑了。", "contradiction")]
    assert [e.text_a for e in glue.get_task("xnli", "de").read_examples(str(TESTDATA / "xnli"), "dev")] == ["Die Katze."]


def test_task_names():
    assert glue.get_task("SST-2") is glue.get_task("sst2") is glue.get_task("SST_2")
    assert glue.get_task("MNLI").eval_splits == ("dev_matched", "dev_mismatched")
    assert glue.get_task("sts-b").is_regression and glue.get_task("mnli").num_labels == 3
    with pytest.raises(ValueError, match="unknown task_name 'glue'"):
        glue.get_task("glue")


# ----------------------------------------------------------------- bad input
def _tsv(tmp_path, text, name="train.tsv"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


RTE_LAYOUT = glue.get_task("rte").split("train").layout
RTE_LABELS = glue.get_task("rte").labels


@pytest.mark.parametrize(
    "text, message",
    [
        ("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\n",
         r"train\.tsv:3: expected 4 tab-separated columns as in the header, found 3"),
        ("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n",
         r"train\.tsv:2: unknown label 'maybe' \(expected one of entailment, not_entailment\)"),
        ("index\tsentence1\tlabel\n", r"train\.tsv:1: header has no column 'sentence2'"),
        (b"index\tsentence1\tsentence2\tlabel\n0\tna\xefve\tb\tentailment\n", r"train\.tsv:2: byte 0xef is not valid"),
        ("", r"train\.tsv: empty file \(expected a header row\)"),
    ],
)
def test_bad_rows_give_one_line_errors(tmp_path, text, message):
    with pytest.raises(InputDataError, match=message) as info:
        glue.read_examples(_tsv(tmp_path, text), RTE_LAYOUT, RTE_LABELS)
    assert "\n" not in str(info.value)


def test_bad_regression_target_and_headerless_columns(tmp_path):
    stsb = glue.get_task("sts-b").split("train").layout
    path = _tsv(tmp_path, "sentence1\tsentence2\tscore\na\tb\tfive\n")
    with pytest.raises(InputDataError, match=r":2: expected a number as the label, found 'five'"):
        glue.read_examples(path, stsb, None)
    cola = glue.get_task("cola").split("train").layout
    path = _tsv(tmp_path, "gj04\t1\t\tGood sentence.\ngj04\t0\n")
    with pytest.raises(InputDataError, match=r":2: expected at least 4 tab-separated columns, found 2"):
        glue.read_examples(path, cola, ("0", "1"))
    with pytest.raises(InputDataError, match=r"cannot read file"):
        glue.get_task("rte").read_examples(str(tmp_path / "nowhere"), "train")


# ----------------------------------------------------------------- features
def test_truncate_seq_pair_takes_from_the_longer_side():
    a, b = list("abcdef"), list("xyz")
    glue.truncate_seq_pair(a, b, 6)
    assert (a, b) == (list("abc"), list("xyz"))
    a, b = list("ab"), list("xy")
    glue.truncate_seq_pair(a, b, 3)  # ties take from B
    assert (a, b) == (list("ab"), list("x"))


def test_feature_layout_padding_and_labels(tiny_tokenizer):
    examples = [glue.InputExample("g0", "the cat sat", "the dog", label="1"),
                glue.InputExample("g1", "hello how are you", None, label="0"),
                glue.InputExample("g2", "the cat", None)]
    features = glue.convert_examples_to_features(examples, ("0", "1"), 8, tiny_tokenizer)
    assert tiny_tokenizer.convert_ids_to_tokens(features[0].input_ids) == [
        "[CLS]", "the", "cat", "sat", "[SEP]", "the", "dog", "[SEP]"]
    assert features[0].segment_ids == [0, 0, 0, 0, 0, 1, 1, 1] and features[0].label_id == 1
    assert len(features[1].input_ids) == 6 and features[1].segment_ids == [0] * 6 and features[1].label_id == 0
    assert features[2].label_id == 0 and features[2].is_real_example
    # Pair truncation: 5 pieces of room for 3 + 2 -> unchanged at 8; at 7, "sat" goes.
    short = glue.convert_examples_to_features(examples[:1], ("0", "1"), 7, tiny_tokenizer)[0]
    assert tiny_tokenizer.convert_ids_to_tokens(short.input_ids) == ["[CLS]", "the", "cat", "[SEP]", "the", "dog",
                                                                     "[SEP]"]
    padded = glue.convert_examples_to_features(examples[1:2], ("0", "1"), 8, tiny_tokenizer, pad_to_max_length=True)[0]
    assert padded.input_mask == [1] * 6 + [0] * 2 and padded.input_ids[6:] == [0, 0]
    arrays = glue.features_to_arrays(features + glue.padding_features(1, 8))
    assert arrays["input_ids"].shape == (4, 8) and list(arrays["is_real_example"]) == [1, 1, 1, 0]
    assert list(arrays["label_ids"]) == [1, 0, 0, 0] and arrays["label_ids"].dtype == np.int32
    regression = glue.convert_examples_to_features([glue.InputExample("r", "the cat", label=3.8)], None, 8,
                                                   tiny_tokenizer)
    assert glue.features_to_arrays(regression)["label_ids"].dtype == np.float32
    with pytest.raises(InputDataError, match="unknown label '2'"):
        glue.convert_examples_to_features([glue.InputExample("x", "a", label="2")], ("0", "1"), 8, tiny_tokenizer)


# ----------------------------------------------------------------- metrics (bert_tf.tasks.metrics)
def test_metrics_by_hand():
    preds, labels = [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0]
    # tp=2 fp=1 fn=1 tn=2
    assert metrics.accuracy(preds, labels) == pytest.approx(4 / 6)
    assert metrics.f1_binary(preds, labels) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert metrics.matthews_corrcoef(preds, labels) == pytest.approx((2 * 2 - 1 * 1) / math.sqrt(3 * 3 * 3 * 3))
    assert metrics.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0  # constant prediction: undefined -> 0
    assert metrics.f1_binary([0, 0], [0, 0]) == 0.0
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 5.0, 9.0]
    # mean x 2.5, mean y 5; sum dx*dy = 1.5*3 + .5*1 + .5*0 + 1.5*4 = 11; sum dx^2 = 5; sum dy^2 = 26.
    assert metrics.pearson(x, y) == pytest.approx(11 / math.sqrt(5 * 26))
    assert metrics.spearman(x, y) == pytest.approx(1.0)
    assert list(metrics.rank_average([10, 20, 20, 5])) == [2.0, 3.5, 3.5, 1.0]
    # Ties: ranks x = [1, 2.5, 2.5, 4], y = [1, 2, 3, 4] -> pearson of ranks.
    assert metrics.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(metrics.pearson([1, 2.5, 2.5, 4], [1, 2, 3, 4]))
    assert metrics.compute_metrics("f1_accuracy", preds, labels)["acc_and_f1"] == pytest.approx((4 / 6 + 2 / 3) / 2)


def test_metrics_agree_with_scipy_and_sklearn():
    stats = pytest.importorskip("scipy.stats")
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for _ in range(5):
        labels, preds = rng.integers(0, 3, 50), rng.integers(0, 3, 50)
        assert metrics.matthews_corrcoef(preds, labels) == pytest.approx(skm.matthews_corrcoef(labels, preds))
        b_labels, b_preds = labels % 2, preds % 2
        assert metrics.f1_binary(b_preds, b_labels) == pytest.approx(skm.f1_score(b_labels, b_preds))
        x, y = rng.integers(0, 6, 40).astype(float), rng.normal(size=40)
        assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
        assert metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])


# ----------------------------------------------------------------- output files
def test_submission_and_result_files(tmp_path):
    mnli = glue.get_task("mnli")
    examples = [glue.InputExample("t0", "a", "b", index="0"), glue.InputExample("t1", "c", "d", index="1")]
    path = glue.write_glue_submission(str(tmp_path), mnli, "test_mismatched", examples, [2, 0])
    assert path.endswith("MNLI-mm.tsv")
    assert (tmp_path / "MNLI-mm.tsv").read_text() == "index\tprediction\n0\tneutral\n1\tcontradiction\n"
    glue.write_glue_submission(str(tmp_path), glue.get_task("sts-b"), "test", examples[:1], [3.14159])
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t3.142\n"
    glue.write_glue_submission(str(tmp_path), glue.get_task("cola"), "test", examples[:1], [1])
    assert (tmp_path / "CoLA.tsv").read_text().splitlines()[1] == "0\t1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CoLA.tsv", "MNLI-mm.tsv", "STS-B.tsv"]
    with pytest.raises(ValueError, match="1 predictions for 2 examples"):
        glue.glue_submission_text(mnli, examples, [0])
    assert glue.test_results_text([[0.25, 0.75], [1.0, 0.0]]) == "0.25\t0.75\n1.0\t0.0\n"
    from bert_tf.model_dir import write_eval_results

    write_eval_results(str(tmp_path / "eval_results.txt"), {"eval_loss": 0.5, "eval_accuracy": 0.75})
    assert (tmp_path / "eval_results.txt").read_text() == "eval_accuracy = 0.75\neval_loss = 0.5\n"


def test_fast_batch_tokenizer_gives_the_same_features(tiny_tokenizer, tmp_path):
    try:
        from bert_tf.tokenization import FastTokenizer
    except (ImportError, AttributeError):
        pytest.skip("FastTokenizer not available")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    fast = FastTokenizer(str(vocab), do_lower_case=True)
    examples = [glue.InputExample("g0", "The cat sat, unwanted!", "How are you?", label="1"),
                glue.InputExample("g1", "running dogs on the mat", "the", label="0")]
    ours = glue.convert_examples_to_features(examples, ("0", "1"), 10, fast)
    assert ours == glue.convert_examples_to_features(examples, ("0", "1"), 10, tiny_tokenizer)
