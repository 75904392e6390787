"""SWAG multiple choice: CSV reader, four-choice features, predictions file (bert_tf.tasks.swag)."""

import csv
import io

import numpy as np
import pytest
from conftest import TESTDATA, TINY_VOCAB, shared_path

from bert_tf.errors import InputDataError
from bert_tf.tasks import swag
from bert_tf.tokenization import FullTokenizer

TINY = str(TESTDATA / "swag_tiny.csv")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    return FullTokenizer(str(path), do_lower_case=True)


def test_reader_quoted_fields_and_labels():
    examples = swag.read_swag_examples(TINY)
    assert [e.swag_id for e in examples] == ["0", "1"]
    assert examples[0].context_sentence == "The cat sat on the mat." and examples[0].start_ending == "The dog"
    assert examples[0].endings == ("sat.", "sat, the cat!", "wanted the mat.", "is running.")
    assert examples[1].endings[3] == "the mat, the cat."
    assert [e.label for e in examples] == [2, 0]


def test_features_context_and_choices(tokenizer):
    examples = swag.read_swag_examples(TINY)
    features = swag.convert_examples_to_features(examples, 32, tokenizer)
    f = features[0]
    assert len(f.input_ids) == swag.NUM_CHOICES and f.label_id == 2
    assert tokenizer.convert_ids_to_tokens(f.input_ids[2]) == [
        "[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]", "the", "dog", "want", "##ed", "the", "mat",
        ".", "[SEP]"]
    assert f.segment_ids[2] == [0] * 9 + [1] * 8
    # 6 pieces of room: the context (7) loses 3 from its end, "the dog sat ." (4) loses 1 (on ties B gives).
    short = swag.convert_examples_to_features(examples[:1], 9, tokenizer)[0]
    assert tokenizer.convert_ids_to_tokens(short.input_ids[0]) == [
        "[CLS]", "the", "cat", "sat", "[SEP]", "the", "dog", "sat", "[SEP]"]
    arrays = swag.features_to_arrays(features, seq_length=24)
    assert arrays["input_ids"].shape == (2, 4, 24) and arrays["input_ids"].dtype == np.int32
    assert list(arrays["label_ids"]) == [2, 0]
    assert arrays["input_mask"][0, 2].sum() == 17


def test_unlabeled_test_file_and_errors(tmp_path):
    header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"
    path = tmp_path / "test.csv"
    path.write_text(header + "\n7,v,1,x,A cat.,The,gold,a,b,c,d\n", encoding="utf-8")
    [example] = swag.read_swag_examples(str(path))
    assert example.label is None and example.endings == ("a", "b", "c", "d")
    path.write_text(header + ",label\n7,v,1,x,A cat.,The,gold,a,b,c,d,4\n", encoding="utf-8")
    with pytest.raises(InputDataError, match=r"test\.csv:2: expected a label 0\.\.3, found '4'"):
        swag.read_swag_examples(str(path))
    path.write_text(header + "\n7,v,1,x,A cat.,The,gold,a,b,c\n", encoding="utf-8")
    with pytest.raises(InputDataError, match=r"test\.csv:2: expected 11 comma-separated columns"):
        swag.read_swag_examples(str(path))
    path.write_text(",video-id,sent1\n", encoding="utf-8")
    with pytest.raises(InputDataError, match=r"test\.csv:1: header has no column 'sent2'"):
        swag.read_swag_examples(str(path))


def test_predictions_text():
    examples = swag.read_swag_examples(TINY)
    probs = np.array([[0.1, 0.2, 0.6, 0.1], [0.7, 0.1, 0.1, 0.1]])
    rows = list(csv.reader(io.StringIO(swag.predictions_text(examples, probs))))
    assert rows[0] == ["id", "ending0", "ending1", "ending2", "ending3", "prediction"]
    assert rows[1][0] == "0" and rows[1][-1] == "2" and float(rows[1][3]) == 0.6 and rows[2][-1] == "0"


@pytest.mark.parametrize("name, labelled", [("train.csv", True), ("val.csv", True), ("test.csv", False)])
def test_real_swag_files(name, labelled):
    path = shared_path("fixtures", "swag", name)
    vocab = shared_path("fixtures", "vocab", "bert-base-uncased-vocab.txt")
    examples = swag.read_swag_examples(str(path))
    assert len(examples) >= 3 and all(len(e.endings) == 4 for e in examples)
    assert all((e.label is not None) == labelled for e in examples)
    tokenizer = FullTokenizer(str(vocab), do_lower_case=True)
    features = swag.convert_examples_to_features(examples, 24, tokenizer, pad_to_max_length=True)
    arrays = swag.features_to_arrays(features)
    assert arrays["input_ids"].shape == (len(examples), 4, 24)
    # Every choice starts with [CLS] and the context; each has exactly two [SEP].
    assert (arrays["input_ids"][:, :, 0] == 101).all() and ((arrays["input_ids"] == 102).sum(-1) == 2).all()
