"""The official SQuAD v1.1 / v2.0 evaluation (bert_tf.tasks.squad_metrics, evaluate_squad.py)."""

import json

import pytest
from conftest import run_script, shared_path

from bert_tf.errors import InputDataError
from bert_tf.tasks import squad_metrics


def _dataset(questions):
    """A SQuAD dataset from [(qid, [answer texts])]."""
    qas = [{"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in answers]}
           for qid, answers in questions]
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


# ----------------------------------------------------------------- hand-computed
def test_normalize_answer():
    assert squad_metrics.normalize_answer("  The Cat's   hat!") == "cats hat"
    assert squad_metrics.normalize_answer("an apple, a pear") == "apple pear"
    assert squad_metrics.normalize_answer("theory") == "theory"  # articles only as whole words


def test_v1_scores_by_hand():
    data = _dataset([("a", ["the big cat", "a cat"]), ("b", ["Paris"]), ("c", ["red fox"])])
    preds = {"a": "big cat", "b": "in Paris, France", "c": "blue"}
    # a: "big cat" == normalised "big cat": EM 1, F1 1. b: EM 0; F1 vs "paris": p=1/3, r=1 -> 0.5.
    # c: no overlap -> 0, 0.
    result = squad_metrics.evaluate_v1(data, preds)
    assert result == {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(100 * 1.5 / 3)}


def test_v1_missing_prediction_scores_zero(capsys):
    data = _dataset([("a", ["cat"]), ("b", ["dog"])])
    assert squad_metrics.evaluate_v1(data, {"a": "cat"}) == {"exact_match": 50.0, "f1": 50.0}
    assert "Unanswered question b will receive score 0." in capsys.readouterr().err


def test_v2_scores_and_threshold_search_by_hand():
    data = _dataset([("h1", ["red fox"]), ("h2", ["cat"]), ("n1", []), ("n2", [])])
    preds = {"h1": "red", "h2": "cat", "n1": "", "n2": "dog"}
    # Raw: h1 EM 0 F1 2/3 (p=1, r=1/2); h2 1/1; n1 1/1 (both empty); n2 0/0.
    result = squad_metrics.evaluate_v2(data, preds)
    assert result["exact"] == pytest.approx(50.0) and result["f1"] == pytest.approx(100 * (2 / 3 + 2) / 4)
    assert (result["HasAns_total"], result["NoAns_total"], result["total"]) == (2, 2, 4)
    assert result["HasAns_f1"] == pytest.approx(100 * (2 / 3 + 1) / 2) and result["NoAns_exact"] == 50.0
    assert "best_f1" not in result
    # With no-answer probabilities: n2 at 0.9 is the only one above 0.5 -> counts as correct "no answer".
    na = {"h1": 0.2, "h2": 0.1, "n1": 0.3, "n2": 0.9}
    result = squad_metrics.evaluate_v2(data, preds, na, na_prob_thresh=0.5)
    assert result["exact"] == pytest.approx(75.0)
    # Sweep in order h2 (0.1: +1), h1 (0.2: +0 EM / +2/3 F1), n1 (0.3: +0), n2 (0.9: -1), from 2 (no-answers).
    assert result["best_exact"] == pytest.approx(75.0) and result["best_exact_thresh"] == 0.1
    assert result["best_f1"] == pytest.approx(100 * (2 + 1 + 2 / 3) / 4) and result["best_f1_thresh"] == 0.2


def _predict_with(preds, null_odds, threshold):
    """What the post-processing predicts with --null_score_diff_threshold=threshold: "" where the
    null score beats the best span by more than the threshold (bert_tf.tasks.squad.compute_predictions)."""
    return {q: "" if null_odds[q] > threshold else text for q, text in preds.items()}


def test_recommended_threshold_reproduces_best_f1_with_all_negative_null_odds():
    # Three unanswerable questions, one answerable that the model gets wrong; every null odd is
    # negative, so with the default threshold 0.0 everything is answered (F1 0).
    data = _dataset([("h1", ["red fox"]), ("n1", []), ("n2", []), ("n3", [])])
    spans = {"h1": "blue", "n1": "dog", "n2": "cat", "n3": "hat"}  # each question's best span
    odds = {"h1": -0.259, "n1": -0.531, "n2": -0.4, "n3": -0.3}
    preds = _predict_with(spans, odds, 0.0)
    official = squad_metrics.evaluate_v2(data, preds, odds)
    assert official["f1"] == 0.0
    # The official numbers stay as the official script reports them: "no answer everywhere" is best
    # (75), reported at the script's initial threshold 0.0, which would answer everything again.
    assert official["best_f1"] == 75.0 and official["best_f1_thresh"] == 0.0
    assert squad_metrics.evaluate_v2(data, _predict_with(spans, odds, 0.0), odds)["f1"] == 0.0
    # The threshold we recommend lies below the smallest null odd and gives that best F1 when passed back.
    best_f1, threshold = squad_metrics.best_null_threshold(data, preds, odds)
    assert best_f1 == 75.0 and threshold < min(odds.values())
    assert threshold == -1.0  # the shortest number that does it
    assert squad_metrics.evaluate_v2(data, _predict_with(spans, odds, threshold), odds)["f1"] == 75.0


def test_recommended_threshold_splits_between_null_odds():
    # Answering h2 and h1 (the two lowest odds) and nothing else is best; the threshold lies at or above
    # h1's odd and below the next one, where the official sweep's own threshold also works.
    data = _dataset([("h1", ["red fox"]), ("h2", ["cat"]), ("n1", []), ("n2", [])])
    spans = {"h1": "red", "h2": "cat", "n1": "owl", "n2": "dog"}
    odds = {"h1": -1.23456, "h2": -2.5, "n1": -1.2345, "n2": 0.7}
    preds = _predict_with(spans, odds, 0.0)
    official = squad_metrics.evaluate_v2(data, preds, odds)
    best_f1, threshold = squad_metrics.best_null_threshold(data, preds, odds)
    assert best_f1 == pytest.approx(official["best_f1"]) == pytest.approx(100 * (2 + 1 + 2 / 3) / 4)
    assert -1.23456 <= threshold < -1.2345 and len(str(threshold)) <= len("-1.23456")
    assert squad_metrics.evaluate_v2(data, _predict_with(spans, odds, threshold), odds)["f1"] == \
        pytest.approx(best_f1)
    # Answering everything is best: any threshold at or above the largest odd, the shortest one.
    answerable = _dataset([("h1", ["red fox"]), ("h2", ["cat"]), ("h3", ["owl"])])
    spans, odds = {"h1": "red fox", "h2": "cat", "h3": "owl"}, {"h1": -1.2, "h2": -2.5, "h3": 0.7}
    best_f1, threshold = squad_metrics.best_null_threshold(answerable, _predict_with(spans, odds, 1.0), odds)
    assert best_f1 == 100.0 and threshold == 1.0
    # Equal odds go together: a threshold cannot answer one of two questions with the same odd.
    odds = {"h1": -1.0, "h2": -1.0, "n1": -1.0, "n2": -1.0}
    spans = {"h1": "red fox", "h2": "cat", "n1": "owl", "n2": "dog"}
    preds = _predict_with(spans, odds, 0.0)
    assert squad_metrics.evaluate_v2(data, preds, odds)["best_f1"] == 100.0  # the sweep splits the tie
    best_f1, threshold = squad_metrics.best_null_threshold(data, preds, odds)
    assert best_f1 == 50.0 and threshold < -1.0
    assert squad_metrics.evaluate_v2(data, _predict_with(spans, odds, threshold), odds)["f1"] == 50.0


def test_v2_missing_prediction_or_probability_is_an_error():
    data = _dataset([("h1", ["cat"]), ("n1", [])])
    with pytest.raises(InputDataError, match="no prediction for question id n1"):
        squad_metrics.evaluate_v2(data, {"h1": "cat"})
    with pytest.raises(InputDataError, match="no probability for question id n1"):
        squad_metrics.evaluate_v2(data, {"h1": "cat", "n1": ""}, {"h1": 0.5})


# ----------------------------------------------------------------- official numbers
def _cases():
    path = shared_path("fixtures", "squad", "official_scores", "cases.json")
    return json.loads(path.read_text()), path.parents[4]  # paths in cases.json start at the folder holding shared/


def test_every_official_case_exactly():
    cases, root = _cases()
    assert len(cases) == 12
    for case in cases:
        na = str(root / case["na_prob_file"]) if case["na_prob_file"] else None
        result = squad_metrics.evaluate_files(str(root / case["data"]), str(root / case["predictions"]),
                                              version=case["version"].lstrip("v"), na_prob_file=na)
        assert dict(result) == case["official"], case["predictions"]  # exact floats, same keys
        assert list(result) == list(case["official"])


@pytest.mark.parametrize(
    "data, preds, version, out",
    [
        ("sample_multiref_answerable_v1.1.json", "preds_v1.1_bert_for_sample.json", "1.1", "v1.1_sample.out.json"),
        ("fixture_dev-v2.0_answerable_as_v1.1.json", "preds_v1.1_bert_for_fixture.json", "1.1",
         "v1.1_fixture.out.json"),
        ("sample_multiref_v2.0.json", "preds_v2.0_bert_for_sample.json", "2.0", "v2.0_sample.out.json"),
        ("../dev-v2.0-small.json", "preds_v2.0_bert_for_fixture.json", "2.0", "v2.0_fixture.out.json"),
    ],
)
def test_reference_scores_exactly(data, preds, version, out):
    ref = shared_path("fixtures", "squad", "reference")
    result = squad_metrics.evaluate_files(str(ref / data), str(ref / preds), version=version)
    assert dict(result) == json.loads((ref / out).read_text())


# ----------------------------------------------------------------- the command
def _run(*args):
    return run_script("evaluate_squad.py", *args, timeout=120)


def test_command_v1_and_v2(tmp_path):
    ref = shared_path("fixtures", "squad", "reference")
    run = _run(ref / "sample_multiref_answerable_v1.1.json", ref / "preds_v1.1_bert_for_sample.json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == json.loads((ref / "v1.1_sample.out.json").read_text())
    cases, root = _cases()
    case = cases[7]
    out = tmp_path / "eval.json"
    run = _run("--version", "2.0", root / case["data"], root / case["predictions"],
               "--na-prob-file", root / case["na_prob_file"], "-o", out)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text()) == case["official"]


def test_command_bad_input_one_line_error(tmp_path):
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"version": "1.1", "data": _dataset([("a", ["cat"])])}))
    preds = tmp_path / "preds.json"
    preds.write_text('{"a": 3}')
    run = _run(data, preds)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().count("\n") == 0 and "preds.json: expected a JSON object" in run.stderr
    run = _run(data, tmp_path / "missing.json")
    assert run.returncode == 1 and "missing.json: cannot read file" in run.stderr
