"""CoNLL-2003 NER: reader, first-piece labelling, windows, conlleval scores, writing back (bert_tf.tasks.conll)."""

import numpy as np
import pytest
from conftest import TESTDATA, shared_path

from bert_tf.errors import InputDataError
from bert_tf.tasks import IGNORE_LABEL_ID, conll
from bert_tf.tokenization import FullTokenizer

TINY = str(TESTDATA / "conll_tiny.txt")
X = IGNORE_LABEL_ID


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from conftest import TINY_VOCAB

    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    return FullTokenizer(str(path), do_lower_case=True)


def test_reader_sentences_documents_and_tags():
    examples = conll.read_conll(TINY)
    assert [e.words for e in examples] == [["The", "cat", "unwanted", "sat", "."], ["running", "dog"], ["Hello"]]
    assert examples[0].labels == ["O", "B-PER", "I-PER", "O", "O"]
    assert [e.docstart_before for e in examples] == [True, True, False]
    assert examples[1].columns[0] == ["running", "VBG", "B-VP", "B-LOC"]
    assert conll.label_list(examples) == ["O", "B-LOC", "B-ORG", "B-PER", "I-PER"]


def test_reader_errors(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU NNP B-NP B-ORG\nrejects\n", encoding="utf-8")
    with pytest.raises(InputDataError, match=r"bad\.txt:2: expected 'word \.\.\. NER-tag'"):
        conll.read_conll(str(path))
    assert conll.read_conll(str(path), has_labels=False)[0].words == ["EU", "rejects"]
    path.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-ORG\n", encoding="utf-8")
    with pytest.raises(InputDataError, match=r"bad\.txt:2: expected 4 columns"):
        conll.read_conll(str(path))
    path.write_bytes(b"EU NNP B-NP B-ORG\n\nM\xfcller NNP B-NP B-PER\n")
    with pytest.raises(InputDataError, match=r"bad\.txt:3: byte 0xfc is not valid UTF-8"):
        conll.read_conll(str(path))


def test_first_piece_carries_the_label(tokenizer):
    examples = conll.read_conll(TINY)
    labels = conll.label_list(examples)  # O B-LOC B-ORG B-PER I-PER
    features = conll.convert_examples_to_features(examples, labels, 16, tokenizer)
    f = features[0]
    assert tokenizer.convert_ids_to_tokens(f.input_ids) == ["[CLS]", "the", "cat", "un", "##want", "##ed", "sat", ".",
                                                            "[SEP]"]
    assert f.label_ids == [X, 0, 3, 4, X, X, 0, 0, X]
    assert f.label_positions == [1, 2, 3, 6, 7]
    assert f.input_mask == [1] * 9 and f.segment_ids == [0] * 9
    with pytest.raises(InputDataError, match="unknown tag 'B-PER'"):
        conll.convert_examples_to_features(examples, ["O", "B-LOC", "B-ORG"], 16, tokenizer)


def test_long_sentences_become_windows_of_whole_words(tokenizer):
    examples = conll.read_conll(TINY)[:1]
    labels = ["O", "B-PER", "I-PER"]
    # Room for 3 pieces: [the cat] [un ##want ##ed] [sat .]
    features = conll.convert_examples_to_features(examples, labels, 5, tokenizer, pad_to_max_length=True)
    assert [f.word_start for f in features] == [0, 2, 3]
    assert [tokenizer.convert_ids_to_tokens(f.input_ids) for f in features] == [
        ["[CLS]", "the", "cat", "[SEP]", "[PAD]"], ["[CLS]", "un", "##want", "##ed", "[SEP]"],
        ["[CLS]", "sat", ".", "[SEP]", "[PAD]"]]
    assert features[1].label_ids == [X, 2, X, X, X] and features[0].input_mask == [1, 1, 1, 1, 0]
    # Predictions per position come back as one tag per word.
    predicted_ids = np.zeros([3, 5], np.int32)
    predicted_ids[0, 2] = 1  # "cat" -> B-PER
    predicted_ids[1, 1] = 2  # "unwanted" -> I-PER
    assert conll.window_predictions_to_labels(examples, features, predicted_ids, labels) == [
        ["O", "B-PER", "I-PER", "O", "O"]]
    arrays = conll.features_to_arrays(features)
    assert arrays["label_ids"].shape == (3, 5) and arrays["label_ids"][0, 4] == X


def test_stride_windows_label_each_word_in_its_max_context_window(tokenizer):
    """--doc_stride: overlapping piece windows; a word is labelled (trained and predicted) only in the window
    where its first piece has the most context (min of the pieces left and right of it in the window, plus
    0.01 x the window's length, the first window winning ties; computed here without the library), so every
    word gets exactly one prediction."""
    rng = np.random.default_rng(0)
    vocabulary = ["the", "cat", "unwanted", "running", "sat", ".", "hello", "dogs"]  # 1, 1, 3, 2, 1, 1, 1, 2 pieces
    words = list(rng.choice(vocabulary, size=30))
    example = conll.NerExample("s", words, ["B-PER" if w == "cat" else "O" for w in words], [[w] for w in words])
    labels = ["O", "B-PER"]
    max_seq_length, stride = 10, 3  # windows of 8 pieces, 3 apart: most pieces sit in two or three windows
    features = conll.convert_examples_to_features([example], labels, max_seq_length, tokenizer, doc_stride=stride)
    pieces = [tokenizer.tokenize(w) for w in words]
    first = np.cumsum([0] + [len(p) for p in pieces])[:-1]  # each word's first piece in the sentence
    total = sum(len(p) for p in pieces)
    spans, start = [], 0
    while True:
        spans.append((start, min(8, total - start)))
        if start + 8 >= total:
            break
        start += stride
    assert len(features) == len(spans) > 5
    for feature, (start, length) in zip(features, spans, strict=True):
        assert feature.input_ids[1:-1] == tokenizer.convert_tokens_to_ids(
            [p for word in pieces for p in word][start:start + length])

    def best_window(position):
        scores = [min(position - s, s + n - 1 - position) + 0.01 * n if s <= position < s + n else -1
                  for s, n in spans]
        return int(np.argmax(scores))  # the first of equal scores

    expected = [best_window(p) for p in first]
    # Predict "the window's number" at every position: each word's tag names the window it came from.
    window_tags = [f"w{i}" for i in range(len(features))]
    position_predictions = np.array([[i] * max_seq_length for i in range(len(features))])
    predicted = conll.window_predictions_to_labels([example], features, position_predictions, window_tags)
    assert predicted == [[f"w{i}" for i in expected]]
    # Training sees each word's label once, where it is predicted; the other windows leave it unlabelled.
    labelled = [(i, first[w] - spans[i][0] + 1) for w, i in enumerate(expected)]
    for i, feature in enumerate(features):
        ids = [(i, p) for p, label in enumerate(feature.label_ids) if label != X]
        assert ids == [(j, p) for j, p in labelled if j == i]
    assert sum(label != X for f in features for label in f.label_ids) == len(words)
    # A sentence that fits is one window, the same as without a stride.
    short = conll.NerExample("t", words[:4], ["O"] * 4, [[w] for w in words[:4]])
    assert conll.convert_examples_to_features([short], labels, 16, tokenizer, doc_stride=stride) == \
        conll.convert_examples_to_features([short], labels, 16, tokenizer)


def test_conlleval_by_hand_iob2():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    # gold chunks PER(0-1) LOC(3) ORG; predicted PER(0-1) ORG(3) ORG: 2 of 3 correct each way.
    r = conll.conlleval(gold, pred)
    assert (r["correct"], r["found_gold"], r["found_predicted"]) == (2, 3, 3)
    assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(2 / 3)
    assert r["accuracy"] == pytest.approx(5 / 6)
    assert r["per_type"]["ORG"]["precision"] == pytest.approx(1 / 2) and r["per_type"]["LOC"]["recall"] == 0.0


def test_conlleval_by_hand_iob1_and_boundaries():
    # IOB1: I- after O starts a chunk; B- only splits two adjacent chunks of one type.
    gold = [["I-PER", "I-PER", "O", "I-LOC"]]
    pred = [["I-PER", "B-PER", "O", "I-LOC"]]
    r = conll.conlleval(gold, pred)
    # gold: PER(0-1), LOC(3); predicted: PER(0), PER(1), LOC(3); only LOC matches.
    assert (r["correct"], r["found_gold"], r["found_predicted"]) == (1, 2, 3)
    assert r["f1"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    # A chunk that ends a sentence is closed by the sentence boundary, not continued into the next.
    r = conll.conlleval([["I-PER"], ["I-PER"]], [["I-PER"], ["I-PER"]])
    assert (r["correct"], r["found_gold"]) == (2, 2)
    # Same span, wrong type: not correct. Type change inside I- tags starts a new chunk.
    r = conll.conlleval([["I-PER", "I-PER"]], [["I-PER", "I-ORG"]])
    assert (r["correct"], r["found_gold"], r["found_predicted"]) == (0, 1, 2)


def test_conlleval_agrees_with_seqeval_on_random_tags():
    seqeval = pytest.importorskip("seqeval.metrics")
    rng = np.random.default_rng(3)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"]
    for _ in range(20):
        gold = [[tags[i] for i in rng.integers(0, len(tags), rng.integers(1, 12))] for _ in range(5)]
        pred = [[t if rng.random() < 0.6 else tags[rng.integers(0, len(tags))] for t in s] for s in gold]
        r = conll.conlleval(gold, pred)
        assert r["precision"] == pytest.approx(seqeval.precision_score(gold, pred))
        assert r["recall"] == pytest.approx(seqeval.recall_score(gold, pred))
        assert r["f1"] == pytest.approx(seqeval.f1_score(gold, pred))


def test_write_back_in_conll_format(tmp_path):
    examples = conll.read_conll(TINY)
    predicted = [["O", "B-PER", "I-PER", "O", "O"], ["B-LOC", "O"], ["O"]]
    out = tmp_path / "pred.txt"
    conll.write_conll_predictions(str(out), examples, predicted)
    text = out.read_text()
    assert text.splitlines()[:4] == ["-DOCSTART- -X- -X- O O", "", "The DT B-NP O O", "cat NN I-NP B-PER B-PER"]
    # Read back: the appended column is the predicted tag, and the gold tags are still there.
    back = conll.read_conll(str(out))
    assert [e.labels for e in back] == predicted
    assert [[c[-2] for c in e.columns] for e in back] == [e.labels for e in examples]


@pytest.mark.parametrize("name", ["train.txt", "valid.txt", "test.txt"])
def test_real_conll2003_files(name):
    path = shared_path("fixtures", "conll2003", name)
    vocab = shared_path("fixtures", "vocab", "bert-base-uncased-vocab.txt")
    examples = conll.read_conll(str(path))
    assert examples and all(len(e.words) == len(e.labels) == len(e.columns) for e in examples)
    assert set(conll.label_list(examples)) <= set(conll.CONLL2003_LABELS)
    assert all(len(c) == 4 for e in examples for c in e.columns)
    tokenizer = FullTokenizer(str(vocab), do_lower_case=True)
    features = conll.convert_examples_to_features(examples, conll.CONLL2003_LABELS, 32, tokenizer)
    # Every word is labelled exactly once, at its first piece.
    labelled = sum(sum(1 for x in f.label_ids if x != X) for f in features)
    assert labelled == sum(len(e.words) for e in examples)
    r = conll.conlleval([e.labels for e in examples], [e.labels for e in examples])
    assert r["f1"] == 1.0 and r["found_gold"] > 0
