"""run_swag.py end to end on a tiny model: learning, files, real SWAG layout, one-line errors.

One subprocess trains/evaluates/predicts through the script; the real-layout run and the
bad-input cases call the library's `run` in-process (no extra TensorFlow start-up).
"""

import csv
import json
import re

import numpy as np
import pytest
from conftest import CPU_ONLY, run_script, shared_path, tiny_run_settings

pytestmark = pytest.mark.slow

HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]
CONTEXTS = ["the cat sat on the mat .", "hello , how are you ?", "a dog sat .", "the mat !"]
WRONG = ["dog sat .", "a dog !", "the dog ?", "dog , dog .", "a mat dog ."]


def swag_rows(n, seed):
    """Rows of a SWAG CSV whose right ending is the only one with 'cat' (learnable from the pair)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = int(rng.integers(4))
        endings = [WRONG[j] for j in rng.choice(len(WRONG), 4, replace=False)]
        endings[label] = ["cat sat .", "the cat !", "a cat ?"][i % 3]
        context = CONTEXTS[i % len(CONTEXTS)]
        rows.append([str(i), f"vid-{i}", str(100 + i), f"{context} the", context, "the", "gold", *endings, str(label)])
    return rows


def write_csv(path, rows, header=HEADER):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("swag_data")
    write_csv(folder / "train.csv", swag_rows(48, seed=1))
    dev = swag_rows(16, seed=2)
    write_csv(folder / "val.csv", dev)
    # test.csv: the dev rows without their label, so predictions can be checked against eval.
    write_csv(folder / "test.csv", [row[:-1] for row in dev], header=HEADER[:-1])
    return folder


@pytest.fixture(scope="module")
def settings(tiny_model):
    """RunSettings for in-process runs (the script's finetune_settings without flags)."""
    return tiny_run_settings(tiny_model, learning_rate=1e-3, iterations_per_loop=2)


def run_swag(*args):
    return run_script("run_swag.py", *args, env=CPU_ONLY)


def read_results(path):
    return dict(line.split(" = ") for line in path.read_text().splitlines())


def test_train_eval_predict_learns_and_writes_files(tiny_model, data_dir, tmp_path):
    out = tmp_path / "out"
    result = run_swag(f"--data_dir={data_dir}", f"--vocab_file={tiny_model / 'vocab.txt'}",
                      f"--bert_config_file={tiny_model / 'bert_config.json'}", f"--output_dir={out}",
                      "--max_seq_length=32", "--train_batch_size=8", "--eval_batch_size=8", "--num_train_epochs=4",
                      "--learning_rate=1e-3", "--iterations_per_loop=12", "--eval_every_steps=12",
                      "--do_train", "--do_eval", "--do_predict")
    assert result.returncode == 0, result.stderr[-3000:]
    results = read_results(out / "eval_results.txt")
    assert set(results) == {"eval_accuracy", "eval_loss", "global_step"}
    assert int(results["global_step"]) == 24  # 48 examples / 8 * 4 epochs
    # The right ending is the only one with 'cat': a working multiple-choice fine-tune finds it.
    assert float(results["eval_accuracy"]) >= 0.9, results
    assert float(results["eval_loss"]) < np.log(4)  # better than uniform over the 4 choices

    with open(out / "test_results.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "ending0", "ending1", "ending2", "ending3", "prediction"]
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(16)]
    probabilities = np.array([[float(x) for x in r[1:5]] for r in rows[1:]])
    predictions = np.array([int(r[5]) for r in rows[1:]])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(predictions, probabilities.argmax(axis=1))
    # test.csv holds the dev rows: predict and eval must agree example by example.
    with open(data_dir / "val.csv", newline="") as f:
        labels = np.array([int(r[-1]) for r in list(csv.reader(f))[1:]])
    assert np.mean(predictions == labels) == pytest.approx(float(results["eval_accuracy"]))

    info = json.loads((out / "bert_tf_info.json").read_text())
    assert info["task_type"] == "multiple_choice" and info["num_choices"] == 4
    assert info["max_seq_length"] == 32 and info["do_lower_case"] is True
    assert (out / "best" / "checkpoint").exists()
    assert "eval_accuracy" in (out / "best" / "best_eval_results.txt").read_text()


@pytest.mark.parametrize("packed", [True, False])
def test_under_xla_learns_with_one_program_per_shape(tiny_model, data_dir, tmp_path, packed):
    """--jit_compile --pack_sequences: the four choice rows of a group hold the same examples at the same
    places; one compiled training step and prediction; the predictions come back one per example, in order.
    Without packing (the GPU default): [B, 4, n] batches cut to a few lengths (the longest choice decides),
    one trace of the step, a prediction program per length and split."""
    out = tmp_path / "out"
    result = run_swag(f"--data_dir={data_dir}", f"--vocab_file={tiny_model / 'vocab.txt'}",
                      f"--bert_config_file={tiny_model / 'bert_config.json'}", f"--output_dir={out}",
                      "--max_seq_length=32", "--train_batch_size=2", "--eval_batch_size=4", "--predict_batch_size=4",
                      "--num_train_epochs=8", "--learning_rate=1e-3", "--iterations_per_loop=8",
                      "--jit_compile", "--do_train", "--do_eval", "--do_predict",
                      *(["--pack_sequences"] if packed else ["--compile_whole_step"]))  # unpacked: as on a GPU
    assert result.returncode == 0, result.stderr[-3000:]
    traced = re.search(r"XLA programs traced: training step (\d+), prediction (\d+)", result.stderr)
    assert traced and int(traced.group(1)) == 1, result.stderr[-2000:]
    assert int(traced.group(2)) == 1 if packed else 1 <= int(traced.group(2)) <= 8  # dev and test: 4 each at most
    assert ("XLA batch shapes" in result.stderr) is not packed
    results = read_results(out / "eval_results.txt")
    assert float(results["eval_accuracy"]) >= 0.9, results
    with open(out / "test_results.csv", newline="") as f:
        assert [r[0] for r in list(csv.reader(f))[1:]] == [str(i) for i in range(16)]


def test_real_swag_layout_in_process(settings, tmp_path):
    """The real SWAG CSVs (train/val with labels, test without) through `run`: 2 steps, eval, predict."""
    from bert_tf.runners.swag import SwagRunConfig, run

    data = shared_path("fixtures", "swag")
    out = tmp_path / "out"
    cfg = SwagRunConfig(data_dir=str(data), output_dir=str(out), run=settings, max_seq_length=64, do_train=True,
                        do_eval=True, do_predict=True, train_batch_size=2, num_train_epochs=1.0)
    results = run(cfg)
    with open(data / "train.csv", newline="") as f:
        n_train = len(list(csv.reader(f))) - 1
    assert results["dev"]["global_step"] == n_train // 2
    assert 0.0 <= results["dev"]["eval_accuracy"] <= 1.0 and np.isfinite(results["dev"]["eval_loss"])
    assert read_results(out / "eval_results.txt")["global_step"] == str(n_train // 2)
    with open(data / "test.csv", newline="") as f:
        test_ids = [r[0] for r in list(csv.reader(f))[1:]]
    with open(out / "test_results.csv", newline="") as f:
        rows = list(csv.reader(f))[1:]
    assert [r[0] for r in rows] == test_ids
    assert all(0 <= int(r[5]) < 4 for r in rows)


def _bad_data(data_dir, tmp_path, case):
    bad = tmp_path / "bad_data"
    bad.mkdir()
    for name in ("train.csv", "val.csv", "test.csv"):
        (bad / name).write_bytes((data_dir / name).read_bytes())
    lines = (bad / "val.csv").read_text().splitlines()
    if case == "missing":
        (bad / "val.csv").unlink()
        return bad, "val.csv: cannot read file"
    if case == "columns":
        lines[3] = lines[3] + ",extra"
        (bad / "val.csv").write_text("\n".join(lines) + "\n")
        return bad, "val.csv:4: expected 12 comma-separated columns as in the header, found 13"
    if case == "label":
        lines[2] = lines[2].rsplit(",", 1)[0] + ",7"
        (bad / "val.csv").write_text("\n".join(lines) + "\n")
        return bad, "val.csv:3: expected a label 0..3, found '7'"
    if case == "no_label":
        (bad / "val.csv").write_text((bad / "test.csv").read_text())
        return bad, "val.csv:1: header has no column 'label'"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing", "columns", "label", "no_label"])
def test_bad_input_raises_and_leaves_output_alone(settings, data_dir, tmp_path, case):
    from bert_tf.errors import InputDataError
    from bert_tf.runners.swag import SwagRunConfig, run

    bad, message = _bad_data(data_dir, tmp_path, case)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    cfg = SwagRunConfig(data_dir=str(bad), output_dir=str(out), run=settings, max_seq_length=32, do_train=True,
                        do_eval=True)
    with pytest.raises(InputDataError, match=message):
        run(cfg)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "precious"


def test_script_error_is_one_line(tiny_model, data_dir, tmp_path):
    bad, message = _bad_data(data_dir, tmp_path, "columns")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    result = run_swag(f"--data_dir={bad}", f"--vocab_file={tiny_model / 'vocab.txt'}",
                      f"--bert_config_file={tiny_model / 'bert_config.json'}", f"--output_dir={out}",
                      "--max_seq_length=32", "--do_train", "--do_eval")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, result.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
