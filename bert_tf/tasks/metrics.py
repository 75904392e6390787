"""The GLUE metrics, in numpy: accuracy, F1 of the positive class, Matthews correlation, Pearson and
Spearman correlation, and `compute_metrics`, which a task's metric name (TaskSpec.metric) maps to the
eval_results.txt entries the original writes."""

from __future__ import annotations

import math
from typing import Dict

import numpy as np


def accuracy(predictions, labels) -> float:
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    return float(np.mean(predictions == labels)) if labels.size else 0.0


def f1_binary(predictions, labels, positive: int = 1) -> float:
    """F1 of the `positive` class (MRPC, QQP); 0.0 when it is never predicted nor present."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    tp = float(np.sum((predictions == positive) & (labels == positive)))
    fp = float(np.sum((predictions == positive) & (labels != positive)))
    fn = float(np.sum((predictions != positive) & (labels == positive)))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def matthews_corrcoef(predictions, labels) -> float:
    """Matthews correlation (CoLA), multi-class form (Gorodkin 2004); 0.0 when undefined."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    classes = np.union1d(predictions, labels)
    # confusion[i, j]: examples of true class i predicted as class j.
    confusion = np.array([[np.sum((labels == a) & (predictions == b)) for b in classes] for a in classes], np.float64)
    t = confusion.sum(axis=1)  # true counts per class
    p = confusion.sum(axis=0)  # predicted counts per class
    c = np.trace(confusion)
    s = confusion.sum()
    denominator = math.sqrt((s * s - np.dot(p, p)) * (s * s - np.dot(t, t)))
    return 0.0 if denominator == 0 else float((c * s - np.dot(t, p)) / denominator)


def pearson(x, y) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    xc, yc = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(np.dot(xc, xc)) * float(np.dot(yc, yc)))
    return float("nan") if denominator == 0 else float(np.dot(xc, yc) / denominator)


def rank_average(x) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (as Spearman's rho needs)."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x, y) -> float:
    return pearson(rank_average(x), rank_average(y))


def compute_metrics(metric: str, predictions, label_ids) -> Dict[str, float]:
    """A task metric by name: "accuracy" -> {accuracy}; "f1_accuracy" -> {f1, accuracy, acc_and_f1};
    "mcc" -> {mcc, accuracy}; "pearson_spearman" -> {pearson, spearman, corr}."""
    if metric == "accuracy":
        return {"accuracy": accuracy(predictions, label_ids)}
    if metric == "f1_accuracy":
        acc, f1 = accuracy(predictions, label_ids), f1_binary(predictions, label_ids)
        return {"accuracy": acc, "f1": f1, "acc_and_f1": (acc + f1) / 2}
    if metric == "mcc":
        return {"mcc": matthews_corrcoef(predictions, label_ids), "accuracy": accuracy(predictions, label_ids)}
    if metric == "pearson_spearman":
        p, s = pearson(predictions, label_ids), spearman(predictions, label_ids)
        return {"pearson": p, "spearman": s, "corr": (p + s) / 2}
    raise ValueError(f"unknown metric {metric!r}")
