"""The official SQuAD evaluation (v1.1 and v2.0), re-implemented number for number.

v1.1 (docs/reference.md §7): exact match and token F1 of normalised answers, the max
over the reference answers, averaged over every question (a question without a
prediction scores 0), in percent: {"exact_match", "f1"}.

v2.0: unanswerable questions have the empty string as their only reference; a
prediction is scored against every non-empty reference. With a no-answer
probability per question (`na_probs`), a question whose probability exceeds
`na_prob_thresh` counts as predicted unanswerable, and the threshold that would
maximise exact / F1 is searched (`best_exact`, `best_f1` and their thresholds).

The arithmetic (summation order, int vs. float scores, the threshold sweep) follows
the official scripts so that the numbers agree to the last bit; tests/test_squad_metrics.py
checks that against the official scripts' own outputs when those fixtures are present.
"""

from __future__ import annotations

import collections
import json
import math
import re
import string
import sys
from typing import Mapping, Optional, Tuple

from bert_tf.errors import InputDataError
from bert_tf.tasks import read_text

# The v2.0 script's default `--na-prob-thresh`.
DEFAULT_NA_PROB_THRESH = 1.0

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower-cases, drops ASCII punctuation and the articles a/an/the, and collapses whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


# ----------------------------------------------------------------- SQuAD v1.1
def exact_match_score_v1(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score_v1(prediction: str, ground_truth: str) -> float:
    """Token F1 as in v1.1 (an empty side gives 0, even when both are empty)."""
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def evaluate_v1(dataset: list, predictions: Mapping[str, str], log=None) -> dict:
    """SQuAD v1.1: `dataset` is the JSON's "data" list, `predictions` {qid: text}.

    Returns {"exact_match": percent, "f1": percent}. Questions without a prediction
    score 0 and are reported on `log` (stderr by default), as the official script does.
    """
    log = sys.stderr if log is None else log
    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    print(f"Unanswered question {qa['id']} will receive score 0.", file=log)
                    continue
                ground_truths = [answer["text"] for answer in qa["answers"]]
                prediction = predictions[qa["id"]]
                exact_match += max(exact_match_score_v1(prediction, gt) for gt in ground_truths)
                f1 += max(f1_score_v1(prediction, gt) for gt in ground_truths)
    if total == 0:
        raise InputDataError("SQuAD dataset has no questions")
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


# ----------------------------------------------------------------- SQuAD v2.0
def _get_tokens(text: str) -> list:
    return normalize_answer(text).split() if text else []


def compute_exact(a_gold: str, a_pred: str) -> int:
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str):
    """Token F1 as in v2.0: if either side is empty, 1 when both are and 0 otherwise."""
    gold_toks = _get_tokens(a_gold)
    pred_toks = _get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _qid_to_has_ans(dataset: list) -> dict:
    return {qa["id"]: bool(qa["answers"]) for article in dataset for p in article["paragraphs"] for qa in p["qas"]}


def _raw_scores(dataset: list, preds: Mapping[str, str]):
    exact_scores, f1_scores = {}, {}
    missing = []
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qid = qa["id"]
                gold_answers = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
                if not gold_answers:
                    # An unanswerable question's only correct answer is the empty string.
                    gold_answers = [""]
                if qid not in preds:
                    missing.append(qid)
                    continue
                a_pred = preds[qid]
                exact_scores[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
                f1_scores[qid] = max(compute_f1(a, a_pred) for a in gold_answers)
    return exact_scores, f1_scores, missing


def _apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    new_scores = {}
    for qid, s in scores.items():
        if na_probs[qid] > na_prob_thresh:
            new_scores[qid] = float(not qid_to_has_ans[qid])
        else:
            new_scores[qid] = s
    return new_scores


def _eval_dict(exact_scores, f1_scores, qid_list=None):
    if not qid_list:
        total = len(exact_scores)
        return collections.OrderedDict(
            [
                ("exact", 100.0 * sum(exact_scores.values()) / total),
                ("f1", 100.0 * sum(f1_scores.values()) / total),
                ("total", total),
            ]
        )
    total = len(qid_list)
    return collections.OrderedDict(
        [
            ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
            ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
            ("total", total),
        ]
    )


def _find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    """Sweeps the no-answer threshold over the sorted probabilities, as the official script does."""
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for qid in qid_list:
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        elif preds[qid]:
            diff = -1
        else:
            diff = 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def _shortest_in(low: float, high: float) -> float:
    """The number with the fewest decimals in [low, high) (low when none shorter is found)."""
    for decimals in range(16):
        scale = 10.0 ** decimals
        value = math.ceil(low * scale) / scale + 0.0  # + 0.0: no "-0.0"
        if low <= value < high:
            return value
    return low


def best_null_threshold(dataset: list, preds: Mapping[str, str], na_probs: Mapping[str, float],
                        key: str = "f1") -> Tuple[float, float]:
    """(best score, threshold): the null-score threshold that gives the best `key` ("f1" or "exact")
    when the post-processing runs again with it, i.e. answers exactly the questions whose
    na_probs (null odds) are at or below it.

    The official sweep's best_*_thresh cannot always be passed back: when answering nothing is best it
    reports its starting value 0.0 (which answers every question whose odd is negative), and it may split
    questions of equal odds that no threshold separates. This sweep moves over distinct odds only and
    returns a threshold strictly inside the best gap: below the smallest odd for "no answer anywhere",
    at or above the largest for "answer everything", otherwise at or above the last odd answered and
    below the next; the shortest such number, so that printing it does not move it. As with the
    official sweep, `preds` are the predictions made, so only thresholds up to the one used are found.
    """
    qid_to_has_ans = _qid_to_has_ans(dataset)
    exact_raw, f1_raw, missing = _raw_scores(dataset, preds)
    if missing:
        raise InputDataError(f"predictions: no prediction for question id {missing[0]} ({len(missing)} missing)")
    scores = f1_raw if key == "f1" else exact_raw
    gains: dict = collections.defaultdict(float)  # odd -> score change when its questions are answered
    for qid, score in scores.items():
        if qid_to_has_ans[qid]:
            gains[na_probs[qid]] += score
        elif preds[qid]:
            gains[na_probs[qid]] -= 1
    odds = sorted(gains)
    current = best = sum(1 for has_ans in qid_to_has_ans.values() if not has_ans)
    answered = 0  # how many distinct odds the best threshold answers
    for i, odd in enumerate(odds):
        current += gains[odd]
        if current > best:
            best, answered = current, i + 1
    if answered == 0:
        low, high = odds[0] - 1.0, odds[0]
    elif answered == len(odds):
        low, high = odds[-1], odds[-1] + 1.0
    else:
        low, high = odds[answered - 1], odds[answered]
    return 100.0 * best / len(scores), _shortest_in(low, high)


def evaluate_v2(
    dataset: list,
    preds: Mapping[str, str],
    na_probs: Optional[Mapping[str, float]] = None,
    na_prob_thresh: float = DEFAULT_NA_PROB_THRESH,
) -> "collections.OrderedDict":
    """SQuAD v2.0: the official script's output dict (exact, f1, total, HasAns_*, NoAns_*,
    and with `na_probs` also best_exact, best_exact_thresh, best_f1, best_f1_thresh).

    Where the official script would die with a KeyError (a question without a prediction,
    or without a no-answer probability), this raises InputDataError naming the first id.
    """
    qid_to_has_ans = _qid_to_has_ans(dataset)
    if not qid_to_has_ans:
        raise InputDataError("SQuAD dataset has no questions")
    exact_raw, f1_raw, missing = _raw_scores(dataset, preds)
    if missing:
        raise InputDataError(f"predictions: no prediction for question id {missing[0]} ({len(missing)} missing)")
    have_na_probs = na_probs is not None
    if not have_na_probs:
        na_probs = {k: 0.0 for k in preds}
    else:
        absent = [qid for qid in qid_to_has_ans if qid not in na_probs]
        if absent:
            raise InputDataError(f"na_prob file: no probability for question id {absent[0]} ({len(absent)} missing)")
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    exact_thresh = _apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    f1_thresh = _apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    out_eval = _eval_dict(exact_thresh, f1_thresh)
    if has_ans_qids:
        for k, v in _eval_dict(exact_thresh, f1_thresh, qid_list=has_ans_qids).items():
            out_eval[f"HasAns_{k}"] = v
    if no_ans_qids:
        for k, v in _eval_dict(exact_thresh, f1_thresh, qid_list=no_ans_qids).items():
            out_eval[f"NoAns_{k}"] = v
    if have_na_probs:
        best_exact, exact_best_thresh = _find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
        best_f1, f1_best_thresh = _find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
        out_eval["best_exact"] = best_exact
        out_eval["best_exact_thresh"] = exact_best_thresh
        out_eval["best_f1"] = best_f1
        out_eval["best_f1_thresh"] = f1_best_thresh
    return out_eval


# ----------------------------------------------------------------- files
def load_json(path: str, what: str):
    """A JSON file, or a InputDataError naming the file, line and column."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputDataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON for {what} ({e.msg})") from None


def load_dataset(path: str) -> dict:
    """A SQuAD JSON file checked for the keys evaluation needs: {"version", "data": [...]}."""
    dataset_json = load_json(path, "a SQuAD dataset")
    if not isinstance(dataset_json, dict) or not isinstance(dataset_json.get("data"), list):
        raise InputDataError(f'{path}: expected a SQuAD JSON object with a "data" list')
    for a, article in enumerate(dataset_json["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise InputDataError(f'{path}: data[{a}]: expected an object with a "paragraphs" list')
        for p, paragraph in enumerate(article["paragraphs"]):
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise InputDataError(f'{path}: data[{a}].paragraphs[{p}]: expected an object with a "qas" list')
            for q, qa in enumerate(paragraph["qas"]):
                where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict) or "id" not in qa:
                    raise InputDataError(f'{path}: {where}: expected an object with an "id"')
                answers = qa.get("answers")
                if not isinstance(answers, list) or not all(isinstance(x, dict) and "text" in x for x in answers):
                    raise InputDataError(f'{path}: question {qa["id"]}: expected "answers": a list of {{"text": ...}}')
    return dataset_json


def load_predictions(path: str) -> dict:
    preds = load_json(path, "predictions")
    if not isinstance(preds, dict) or not all(isinstance(v, str) for v in preds.values()):
        raise InputDataError(f"{path}: expected a JSON object {{question id: answer text}}")
    return preds


def load_na_probs(path: str) -> dict:
    na_probs = load_json(path, "no-answer probabilities")
    if not isinstance(na_probs, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in na_probs.values()
    ):
        raise InputDataError(f"{path}: expected a JSON object {{question id: number}}")
    return na_probs


def evaluate_files(
    data_file: str,
    pred_file: str,
    version: str = "1.1",
    na_prob_file: Optional[str] = None,
    na_prob_thresh: float = DEFAULT_NA_PROB_THRESH,
    log=None,
) -> dict:
    """Runs the official evaluation of `version` ("1.1" or "2.0") on files; returns its output dict."""
    dataset_json = load_dataset(data_file)
    preds = load_predictions(pred_file)
    log = sys.stderr if log is None else log
    if version == "1.1":
        if na_prob_file:
            raise InputDataError("--na-prob-file is a SQuAD v2.0 option (use --version 2.0)")
        if dataset_json.get("version") != "1.1":
            # The official script warns and carries on.
            print(f"Evaluation expects v-1.1, but got dataset with v-{dataset_json.get('version')}", file=log)
        return evaluate_v1(dataset_json["data"], preds, log=log)
    if version == "2.0":
        na_probs = load_na_probs(na_prob_file) if na_prob_file else None
        return evaluate_v2(dataset_json["data"], preds, na_probs, na_prob_thresh)
    raise ValueError(f"SQuAD version must be '1.1' or '2.0', got {version!r}")
