"""run_ner.py end to end on a tiny model: learning, conlleval scores, CoNLL write-back, real layout, errors.

One subprocess trains/evaluates/predicts through the script; re-evaluating its model, the
real-layout run and the bad-input cases call the library's `run` in-process.
"""

import json
import re

import numpy as np
import pytest
from conftest import CPU_ONLY, run_script, shared_path, tiny_run_settings

pytestmark = pytest.mark.slow

# Every word has one tag, so the task is learnable word by word; "dogs", "unwanted" and "running"
# are several word pieces (dog ##s, un ##want ##ed, runn ##ing) and "running lowest" is a two-word entity.
ENTITIES = [[("cat", "B-PER")], [("dogs", "B-ORG")], [("unwanted", "B-MISC")],
            [("running", "B-LOC"), ("lowest", "I-LOC")]]
OTHER = ["the", "a", "sat", "on", "mat", ".", "hello", "how", "are", "you", "!", "?", ",", "low", "want"]
MAX_SEQ_LENGTH = 16


def sentences(n, seed, long_every=0):
    """n tagged sentences of 3-8 words (a 20-word one every `long_every`, longer than one window)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = 20 if long_every and i % long_every == 0 else int(rng.integers(3, 9))
        words = []
        while len(words) < length:
            if rng.random() < 0.35:
                words += ENTITIES[int(rng.integers(len(ENTITIES)))]
            else:
                words.append((OTHER[int(rng.integers(len(OTHER)))], "O"))
        out.append(words)
    return out


def conll_file(path, sents, columns=4):
    lines = ["-DOCSTART- -X- -X- O", ""] if columns == 4 else []
    for sent in sents:
        for word, tag in sent:
            lines.append(f"{word} NN O {tag}" if columns == 4 else word)
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_results(path):
    return dict(line.split(" = ") for line in path.read_text().splitlines())


def word_lines(path):
    return [line.split() for line in path.read_text().splitlines() if line.strip() and "-DOCSTART-" not in line]


def sentences_of(path, gold_col, pred_col):
    """(gold, predicted) tag sentences from a written predictions file."""
    gold, pred, g, p = [], [], [], []
    for line in path.read_text().splitlines() + [""]:
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if g:
                gold.append(g)
                pred.append(p)
            g, p = [], []
            continue
        g.append(fields[gold_col])
        p.append(fields[pred_col])
    return gold, pred


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ner_data")
    conll_file(folder / "train.txt", sentences(48, seed=1))
    conll_file(folder / "valid.txt", sentences(16, seed=2, long_every=5))
    conll_file(folder / "test.txt", sentences(6, seed=3, long_every=3), columns=1)  # words only
    return folder


@pytest.fixture(scope="module")
def settings(tiny_model):
    """RunSettings for in-process runs (the script's finetune_settings without flags)."""
    return tiny_run_settings(tiny_model, learning_rate=1e-3, iterations_per_loop=2)


def run_ner(*args):
    return run_script("run_ner.py", *args, env=CPU_ONLY)


def model_args(tiny_model, data_dir, out):
    return [f"--data_dir={data_dir}", f"--vocab_file={tiny_model / 'vocab.txt'}",
            f"--bert_config_file={tiny_model / 'bert_config.json'}", f"--output_dir={out}",
            f"--max_seq_length={MAX_SEQ_LENGTH}"]


@pytest.fixture(scope="module")
def trained(tiny_model, data_dir, tmp_path_factory):
    """The script's train + eval + predict run; its output_dir."""
    out = tmp_path_factory.mktemp("ner_run") / "out"
    result = run_ner(*model_args(tiny_model, data_dir, out), "--train_batch_size=8", "--num_train_epochs=4",
                     "--learning_rate=1e-3", "--iterations_per_loop=12", "--do_train", "--do_eval", "--do_predict")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_train_eval_predict_learns_and_writes_files(trained, data_dir, tiny_model):
    from bert_tf.tasks import conll
    from bert_tf.tasks.conll import CONLL2003_LABELS, conlleval
    from bert_tf.tokenization import FullTokenizer

    results = read_results(trained / "eval_results.txt")
    assert {"eval_precision", "eval_recall", "eval_f1", "eval_accuracy", "eval_loss", "global_step"} <= set(results)
    # Steps count windows (a sentence longer than max_seq_length is several training examples).
    windows = conll.convert_examples_to_features(conll.read_conll(str(data_dir / "train.txt")), CONLL2003_LABELS,
                                                 MAX_SEQ_LENGTH, FullTokenizer(str(tiny_model / "vocab.txt")))
    assert int(results["global_step"]) == int(len(windows) / 8 * 4)
    # Each word's tag is fixed: a working tagger gets the entities right (conlleval F1).
    assert float(results["eval_f1"]) >= 0.9, results
    assert float(results["eval_PER_f1"]) >= 0.9, results
    assert float(results["eval_LOC_f1"]) >= 0.75, results  # the two-word entity: B-LOC then I-LOC

    # eval_predictions.txt is valid.txt with a predicted tag appended, and it is what was scored.
    written = word_lines(trained / "eval_predictions.txt")
    source = word_lines(data_dir / "valid.txt")
    assert [w[:-1] for w in written] == source  # every word of every window, in order, gold kept
    assert {w[-1] for w in written} <= set(CONLL2003_LABELS)
    gold, pred = sentences_of(trained / "eval_predictions.txt", -2, -1)
    scores = conlleval(gold, pred)
    assert scores["f1"] == pytest.approx(float(results["eval_f1"]))
    assert scores["precision"] == pytest.approx(float(results["eval_precision"]))

    # The test file has words only: `word pred` lines, no scores.
    test_lines = word_lines(trained / "test_predictions.txt")
    assert [w[0] for w in test_lines] == [w[0] for w in word_lines(data_dir / "test.txt")]
    assert all(len(w) == 2 for w in test_lines)
    assert not (trained / "test_results.txt").exists()

    info = json.loads((trained / "bert_tf_info.json").read_text())
    assert info["task_type"] == "tagging" and info["label_list"] == list(CONLL2003_LABELS)
    assert info["max_seq_length"] == MAX_SEQ_LENGTH and info["do_lower_case"] is True


@pytest.mark.parametrize("packed", [True, False])
def test_under_xla_learns_with_one_program_per_shape(tiny_model, data_dir, tmp_path, packed):
    """--jit_compile --pack_sequences: sentences share rows, tags move with their tokens and come back per
    sentence; one compiled training step and one prediction. Without packing (the GPU default): batches cut to
    a few lengths chosen from the data, one trace of the step and a prediction program per length."""
    out = tmp_path / "out"
    result = run_ner(*model_args(tiny_model, data_dir, out), "--train_batch_size=4", "--num_train_epochs=8",
                     "--learning_rate=1e-3", "--iterations_per_loop=12", "--jit_compile", "--do_train", "--do_eval",
                     *(["--pack_sequences"] if packed else ["--compile_whole_step"]))  # unpacked: as on a GPU
    assert result.returncode == 0, result.stderr[-3000:]
    traced = re.search(r"XLA programs traced: training step (\d+), prediction (\d+)", result.stderr)
    assert traced and int(traced.group(1)) == 1, result.stderr[-2000:]
    assert int(traced.group(2)) == 1 if packed else 1 <= int(traced.group(2)) <= 4
    assert ("XLA batch shapes" in result.stderr) is not packed
    results = read_results(out / "eval_results.txt")
    assert float(results["eval_f1"]) >= 0.9, results
    assert [w[:-1] for w in word_lines(out / "eval_predictions.txt")] == word_lines(data_dir / "valid.txt")


def test_eval_only_reloads_the_trained_model_and_its_labels(trained, settings, data_dir):
    """Evaluating the output_dir again (labels from its bert_tf_info.json) gives the same scores."""
    from bert_tf.runners.ner import NerRunConfig, run

    before = read_results(trained / "eval_results.txt")
    results = run(NerRunConfig(data_dir=str(data_dir), output_dir=str(trained), run=settings,
                               max_seq_length=MAX_SEQ_LENGTH, do_eval=True))["dev"]
    assert results["global_step"] == int(before["global_step"])
    assert results["eval_f1"] == pytest.approx(float(before["eval_f1"]))
    assert results["eval_loss"] == pytest.approx(float(before["eval_loss"]), rel=1e-4)


def test_stride_windows_tag_every_word_once(settings, data_dir, tmp_path):
    """doc_stride > 0: the 20-word dev and test sentences (several overlapping windows at max_seq_length 16)
    get one tag per word in the written files, and conlleval over eval_predictions.txt is eval_f1."""
    from bert_tf.runners.ner import NerRunConfig, run
    from bert_tf.tasks.conll import conlleval

    out = tmp_path / "out"
    results = run(NerRunConfig(data_dir=str(data_dir), output_dir=str(out), run=settings,
                               max_seq_length=MAX_SEQ_LENGTH, doc_stride=4, do_train=True, do_eval=True,
                               do_predict=True, train_batch_size=8, num_train_epochs=1.0))
    assert [w[:-1] for w in word_lines(out / "eval_predictions.txt")] == word_lines(data_dir / "valid.txt")
    assert [w[:-1] for w in word_lines(out / "test_predictions.txt")] == word_lines(data_dir / "test.txt")
    gold, pred = sentences_of(out / "eval_predictions.txt", -2, -1)
    assert max(len(g) for g in gold) == 20
    assert conlleval(gold, pred)["f1"] == pytest.approx(results["dev"]["eval_f1"])
    assert json.loads((out / "bert_tf_info.json").read_text())["doc_stride"] == 4


def test_real_conll_layout_in_process(settings, tmp_path):
    """The real CoNLL-2003 files through `run`: 2 steps, eval on valid.txt, tagged test.txt scored too."""
    from bert_tf.runners.ner import NerRunConfig, run

    data = shared_path("fixtures", "conll2003")
    out = tmp_path / "out"
    results = run(NerRunConfig(data_dir=str(data), output_dir=str(out), run=settings, max_seq_length=32,
                               do_train=True, do_eval=True, do_predict=True, train_batch_size=1,
                               num_train_epochs=2.0))
    assert results["dev"]["global_step"] >= 2
    for split, source in (("eval", "valid.txt"), ("test", "test.txt")):
        written = word_lines(out / f"{split}_predictions.txt")
        assert [w[:-1] for w in written] == word_lines(data / source)
        gold, pred = sentences_of(out / f"{split}_predictions.txt", -2, -1)
        from bert_tf.tasks.conll import conlleval

        assert conlleval(gold, pred)["f1"] == pytest.approx(results["dev" if split == "eval" else "test"][f"{split}_f1"])
    assert set(read_results(out / "test_results.txt")) >= {"test_f1", "test_precision", "test_recall"}


def _bad_data(data_dir, tmp_path, case):
    bad = tmp_path / "bad_data"
    bad.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        (bad / name).write_bytes((data_dir / name).read_bytes())
    lines = (bad / "valid.txt").read_text().splitlines()
    if case == "missing":
        (bad / "valid.txt").unlink()
        return bad, "valid.txt: cannot read file"
    if case == "columns":
        lines[4] = " ".join(lines[4].split()[:-2] + lines[4].split()[-1:])  # a 3-column line (file line 5)
        (bad / "valid.txt").write_text("\n".join(lines) + "\n")
        return bad, "valid.txt:5: expected 4 columns as on the first word line, found 3"
    if case == "label":
        lines[3] = lines[3].rsplit(" ", 1)[0] + " B-FOO"
        (bad / "valid.txt").write_text("\n".join(lines) + "\n")
        return bad, "unknown tag 'B-FOO'.*pass the full set with --labels"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing", "columns", "label"])
def test_bad_input_raises_and_leaves_output_alone(settings, data_dir, tmp_path, case):
    from bert_tf.errors import InputDataError
    from bert_tf.runners.ner import NerRunConfig, run

    bad, message = _bad_data(data_dir, tmp_path, case)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    cfg = NerRunConfig(data_dir=str(bad), output_dir=str(out), run=settings, max_seq_length=MAX_SEQ_LENGTH,
                       do_train=True, do_eval=True)
    with pytest.raises(InputDataError, match=message):
        run(cfg)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_script_error_is_one_line(tiny_model, data_dir, tmp_path):
    bad, _ = _bad_data(data_dir, tmp_path, "label")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    result = run_ner(*model_args(tiny_model, bad, out), "--labels=O,B-PER,B-ORG,B-MISC,B-LOC,I-LOC",
                     "--do_train", "--do_eval")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "unknown tag 'B-FOO'" in last, result.stderr[-2000:]
    assert "valid.txt" in last and "--labels" not in last  # the tag set was given, not read from train
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
