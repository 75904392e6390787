"""run_squad.py end to end on a tiny model: the original's files, built-in official evaluation, learning, errors.

Two TensorFlow runs in all, side by side (TF start-up dominates): a v2.0 and a v1.1
fine-tune + predict on a synthetic task. Bad input fails before TensorFlow starts, so
those cases are cheap.
"""

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys

import pytest
from conftest import CPU_ONLY, REPO, TESTDATA, run_script, run_script_main

from bert_tf.errors import InputDataError
from bert_tf.tasks import squad, squad_metrics

pytestmark = pytest.mark.slow

# A task a tiny model learns in a few dozen steps: the answer is the one number word in
# the context; a third of the v2.0 questions have none (unanswerable).
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "which", "number", "?"] + WORDS + NUMBERS
TINY_CONFIG = dict(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, type_vocab_size=2, max_position_embeddings=64)
# Contexts of up to 21 words in 24-piece windows (18 for the context): long ones get several windows.
WINDOW_ARGS = ["--max_seq_length=24", "--doc_stride=8"]
TRAIN_QUESTIONS, BATCH, EPOCHS = 96, 16, 6
N_BEST = 5


def synthetic_squad(n, seed, v2, prefix):
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 20))]
        qa = {"id": f"{prefix}-{i}", "question": "which number ?"}
        if v2 and i % 3 == 2:
            qa.update(answers=[], is_impossible=True)
        else:
            pos = rng.randrange(len(words) + 1)
            answer = rng.choice(NUMBERS)
            words.insert(pos, answer)
            start = len(" ".join(words[:pos])) + (1 if pos else 0)
            qa["answers"] = [{"text": answer, "answer_start": start}]
            if v2:
                qa["is_impossible"] = False
        paragraphs.append({"context": " ".join(words), "qas": [qa]})
    return {"version": "v2.0" if v2 else "1.1", "data": [{"title": "synthetic", "paragraphs": paragraphs}]}


def squad_command(*args):
    return [sys.executable, str(REPO / "run_squad.py"), *args]


def squad_env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


def run_squad(*args):
    return run_script("run_squad.py", *args, env=CPU_ONLY)


def read_eval_results(path):
    pairs = [line.split(" = ") for line in path.read_text().splitlines()]
    return {k: float(v) for k, v in pairs}, [k for k, _ in pairs]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("squad")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (folder / "bert_config.json").write_text(json.dumps(TINY_CONFIG))
    for name, data in [("train.json", synthetic_squad(TRAIN_QUESTIONS, 1, True, "train")),
                       ("dev.json", synthetic_squad(30, 2, True, "dev")),
                       ("train1.json", synthetic_squad(TRAIN_QUESTIONS, 4, False, "train1")),
                       ("dev1.json", synthetic_squad(20, 3, False, "dev1"))]:
        (folder / name).write_text(json.dumps(data))
    return folder


def model_args(files):
    return [f"--vocab_file={files / 'vocab.txt'}", f"--bert_config_file={files / 'bert_config.json'}"]


@pytest.fixture(scope="module")
def runs(files):
    """The two TensorFlow runs, started side by side (most of their time is TensorFlow's start-up):
    v2.0 and v1.1, each a fine-tune on the synthetic task and a prediction on its dev file."""
    common = [*model_args(files), *WINDOW_ARGS, f"--train_batch_size={BATCH}", f"--num_train_epochs={EPOCHS}",
              "--learning_rate=2e-3", "--iterations_per_loop=12", "--do_train"]
    commands = {
        "v2": squad_command(*common, f"--output_dir={files / 'out_v2'}", "--version_2_with_negative",
                            f"--train_file={files / 'train.json'}", "--do_predict",
                            f"--predict_file={files / 'dev.json'}", f"--n_best_size={N_BEST}"),
        # v1.1 runs under XLA: a few static lengths, one trace of the training step.
        "v1": squad_command(*common, f"--output_dir={files / 'out_v1'}", f"--train_file={files / 'train1.json'}",
                            "--do_eval", f"--predict_file={files / 'dev1.json'}", "--jit_compile",
                            "--compile_whole_step"),  # the GPU default's whole step
    }
    procs = {k: subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=squad_env(),
                                 cwd=REPO) for k, c in commands.items()}
    results = {}
    for key, proc in procs.items():
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{key}: {stderr[-3000:]}"
        results[key] = (files / f"out_{key}", stderr)
    return results


@pytest.fixture(scope="module")
def trained_v2(runs):
    return runs["v2"]


def test_v2_train_predict_writes_the_original_files(files, trained_v2):
    out, _ = trained_v2
    dev = json.loads((files / "dev.json").read_text())
    qids = [qa["id"] for p in dev["data"][0]["paragraphs"] for qa in p["qas"]]
    predictions = json.loads((out / "predictions.json").read_text())
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    null_odds = json.loads((out / "null_odds.json").read_text())
    assert list(predictions) == qids and list(nbest) == qids and list(null_odds) == qids
    for qid in qids:
        entries = nbest[qid]
        assert 1 <= len(entries) <= N_BEST + 1  # n-best plus the null answer when it fell outside
        assert all(set(e) == {"text", "probability", "start_logit", "end_logit"} for e in entries)
        assert math.isclose(sum(e["probability"] for e in entries), 1.0, rel_tol=1e-6)
        assert "" in [e["text"] for e in entries]  # v2.0: the null answer always competes
        best_non_null = next((e for e in entries if e["text"]), None)
        if best_non_null is None:
            # No valid span among the top starts/ends (the original crashed here): certainly null.
            assert predictions[qid] == "" and null_odds[qid] == squad.NULL_ODDS_WITHOUT_SPAN
            continue
        null = next(e for e in entries if not e["text"])
        # null_odds = score_null - best_non_null, and the threshold (0.0) decides the prediction.
        assert math.isclose(null_odds[qid], null["start_logit"] + null["end_logit"]
                            - best_non_null["start_logit"] - best_non_null["end_logit"], abs_tol=1e-4)
        assert predictions[qid] == ("" if null_odds[qid] > 0.0 else best_non_null["text"])
    info = json.loads((out / "bert_tf_info.json").read_text())
    assert info["task_type"] == "span" and info["do_lower_case"] is True
    assert (info["max_seq_length"], info["doc_stride"], info["max_query_length"]) == (24, 8, 64)
    steps = int(TRAIN_QUESTIONS / BATCH * EPOCHS)
    assert (out / f"ckpt-{steps}.index").exists()


def test_v2_learns_and_reports_official_metrics(trained_v2):
    out, stderr = trained_v2
    results, keys = read_eval_results(out / "eval_results.txt")
    assert keys == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact", "NoAns_f1",
                    "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh", "global_step"]
    assert (results["total"], results["HasAns_total"], results["NoAns_total"]) == (30, 20, 10)
    # An untrained head finds no number (exact ~0); the fine-tuned one finds it and spots its absence.
    assert results["HasAns_exact"] >= 90 and results["NoAns_exact"] >= 80, results
    assert results["best_f1"] >= results["f1"]
    if re.search(r"predict with --null_score_diff_threshold=\S+ for f1 ", stderr) is None:
        assert "best null threshold: none better than the one used (0," in stderr
    assert list((out / "eval").glob("events.out.tfevents.*"))  # dev metrics for TensorBoard


def test_v2_recommended_threshold_passed_back_gives_the_logged_f1(files, trained_v2, tmp_path):
    """The README's rerun: predict again from the trained output_dir with the threshold the log names."""
    out, stderr = trained_v2
    dev = json.loads((files / "dev.json").read_text())["data"]
    predictions = json.loads((out / "predictions.json").read_text())
    null_odds = json.loads((out / "null_odds.json").read_text())
    f1, threshold = squad_metrics.best_null_threshold(dev, predictions, null_odds)
    found = re.search(r"predict with --null_score_diff_threshold=(\S+) for f1 (\S+)", stderr)
    if found is None:  # the threshold used was already the best
        assert f1 <= read_eval_results(out / "eval_results.txt")[0]["f1"]
        threshold = 0.0
    else:
        assert float(found.group(1)) == threshold and float(found.group(2)) == pytest.approx(f1, abs=1e-4)
    rerun = tmp_path / "rerun"
    shutil.copytree(out, rerun)
    result = run_squad(f"--init_checkpoint={rerun}", *WINDOW_ARGS, f"--output_dir={rerun}",
                       "--version_2_with_negative", "--do_predict", f"--predict_file={files / 'dev.json'}",
                       f"--n_best_size={N_BEST}", f"--null_score_diff_threshold={threshold}")
    assert result.returncode == 0, result.stderr[-3000:]
    again = read_eval_results(rerun / "eval_results.txt")[0]
    assert again["f1"] == pytest.approx(f1, abs=1e-9)
    assert again["f1"] >= read_eval_results(out / "eval_results.txt")[0]["f1"]


def test_builtin_eval_equals_the_official_command(files, trained_v2):
    # What `evaluate_squad.py --version 2.0 dev.json predictions.json --na-prob-file null_odds.json` computes.
    out, _ = trained_v2
    official = squad_metrics.evaluate_files(str(files / "dev.json"), str(out / "predictions.json"), "2.0",
                                            str(out / "null_odds.json"))
    results, _ = read_eval_results(out / "eval_results.txt")
    assert set(official) == set(results) - {"global_step"}
    for key, value in official.items():
        assert math.isclose(results[key], value, rel_tol=1e-12), key


def test_v1_train_and_eval(runs):
    out, stderr = runs["v1"]
    # Under XLA the windows are cut to a few lengths chosen from the data: one trace, a program per length.
    traced = re.search(r"XLA programs traced: training step (\d+), prediction (\d+)", stderr)
    assert traced and int(traced.group(1)) == 1 and 1 <= int(traced.group(2)) <= 4, stderr[-2000:]
    assert "train: XLA batch shapes" in stderr and "of positions real (padded to" in stderr
    assert "XLA: on, the whole step as one program" in stderr
    results, keys = read_eval_results(out / "eval_results.txt")
    assert keys == ["exact_match", "f1", "global_step"]
    assert results["exact_match"] >= 90, results
    assert not (out / "null_odds.json").exists()
    predictions = json.loads((out / "predictions.json").read_text())
    assert len(predictions) == 20 and all(predictions.values())  # v1.1: always a span
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert list(nbest) == list(predictions)
    for qid, entries in nbest.items():  # no null answer in v1.1; the best entry is the prediction
        assert 1 <= len(entries) <= squad.DEFAULT_N_BEST_SIZE and all(e["text"] for e in entries)
        assert entries[0]["text"] == predictions[qid]
    assert json.loads((out / "bert_tf_info.json").read_text())["version_2_with_negative"] is False


@pytest.mark.parametrize(
    "args, message",
    [
        (["--do_train"], "--do_train needs --train_file"),
        (["--do_train", "--train_file=/nonexistent/train.json"], "/nonexistent/train.json: cannot read file"),
        (["--do_train", "--train_file={bad_json}"], "not valid JSON for a SQuAD dataset"),
        (["--do_train", f"--train_file={TESTDATA / 'squad_tiny_v2.json'}"], "pass --version_2_with_negative"),
        (["--do_eval", "--predict_file={no_answers}"], "question x-1 has no reference answers"),
        (["--do_predict", f"--predict_file={TESTDATA / 'squad_tiny_v2.json'}", "--version_2_with_negative",
          "--doc_stride=0"], "--doc_stride must be positive"),
        ([f"--predict_file={TESTDATA / 'squad_tiny_v2.json'}"], "at least one of --do_train"),
        (["--do_predict", f"--predict_file={TESTDATA / 'squad_tiny_v2.json'}", "--version_2_with_negative",
          *WINDOW_ARGS, "--pack_sequences"], "--pack_sequences does not apply here"),
    ],
)
def test_bad_input_is_one_line_and_leaves_output_alone(files, tmp_path, args, message):
    """run_squad.py's main in this process: its exit code is the one `error:` line (a fresh process shows that
    line on stderr: tests/test_gate.py)."""
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"version": "1.1", "data": [\n')
    no_answers = tmp_path / "test.json"
    no_answers.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "one two", "qas": [{"id": "x-1", "question": "which number ?"}]}]}]}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    args = [a.format(bad_json=bad_json, no_answers=no_answers) for a in args]
    code = run_script_main("run_squad", *model_args(files), f"--output_dir={out}", *args)
    assert isinstance(code, str) and code.startswith("error: ") and "\n" not in code and message in code, code
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


# ----------------------------------------------------------------- plain Python: no TensorFlow
def test_builtin_eval_gives_the_official_numbers(shared):
    from bert_tf.runners.squad import SquadRunConfig, evaluate_predictions

    cases = json.loads(shared("fixtures", "squad", "official_scores", "cases.json").read_text())
    assert {c["version"] for c in cases} == {"v1.1", "v2.0"}
    for case in cases:
        def load(rel):
            return json.loads(shared(*rel.split("/")[1:]).read_text())

        cfg = SquadRunConfig(output_dir="unused", version_2_with_negative=case["version"] == "v2.0")
        null_odds = load(case["na_prob_file"]) if case["na_prob_file"] else None
        results = evaluate_predictions(load(case["data"])["data"], load(case["predictions"]), null_odds, cfg)
        assert results == case["official"], case["predictions"]


def test_read_inputs_on_real_layouts(shared):
    from bert_tf.runners.squad import SquadRunConfig, read_inputs

    squad_dir = shared("fixtures", "squad")
    v2 = SquadRunConfig(output_dir="unused", version_2_with_negative=True, do_train=True, do_predict=True,
                        train_file=str(squad_dir / "train-v2.0-dummy.json"),
                        predict_file=str(squad_dir / "dev-v2.0-small.json"))
    inputs = read_inputs(v2)
    assert len(inputs.train_examples) == 2 and len(inputs.predict_examples) == 14
    assert inputs.dev_data is not None  # answers and is_impossible everywhere: evaluated
    with pytest.raises(InputDataError, match="pass --version_2_with_negative"):
        read_inputs(SquadRunConfig(output_dir="unused", do_predict=True, predict_file=v2.predict_file))
    for name in ("reference/fixture_dev-v2.0_answerable_as_v1.1.json", "xquad/xquad.zh.json"):
        v1 = SquadRunConfig(output_dir="unused", do_eval=True, predict_file=str(squad_dir / name))
        inputs = read_inputs(v1)
        assert inputs.predict_examples and inputs.dev_data is not None and inputs.train_examples is None


def test_best_threshold_advice(caplog):
    from bert_tf.runners.squad import _log_best_threshold

    metrics = dict(f1=70.0, best_f1=75.5, best_f1_thresh=0.0, best_exact=72.0, best_exact_thresh=0.0)
    with caplog.at_level("INFO", logger="bert_tf.squad"):
        _log_best_threshold(metrics, 0.0, (75.5, -1.0))
        _log_best_threshold(dict(metrics, best_f1=70.0), -1.0, (70.0, -1.0))
    # The official best_f1_thresh (0.0 for "no answer anywhere") is named as such, not recommended.
    assert "official best_f1_thresh 0.0000" in caplog.messages[0]
    assert "predict with --null_score_diff_threshold=-1.0 for f1 75.5000" in caplog.messages[0]
    assert "none better than the one used (-1, f1 70.0000)" in caplog.messages[1]
