"""Sentence(-pair) classification and regression fine-tuning: GLUE, XNLI and your own TSV/CSV.

The library side of run_classifier.py: `run(ClassifierRunConfig)` trains, evaluates
and predicts, and writes the original's files (`eval_results.txt`,
`test_results.tsv`) plus GLUE submission files (`<TASK>.tsv`) into output_dir.

Inputs longer than max_seq_length are truncated (`long_inputs="truncate"`, the original), or
cut into windows `doc_stride` pieces apart (`long_inputs="windows"`,
glue.convert_examples_to_windows): training sees every window with its input's label, each
window weighted 1 / (windows of its input) so a long input weighs what a short one does;
evaluation and prediction turn the windows' logits into one output per input
(`window_aggregation`: mean, max or first; bert_tf.tasks.windows.aggregate_windows), so every
output file keeps one row per input.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Dict

import numpy as np
import tensorflow as tf

from bert_tf.configs import TaskRecord
from bert_tf.fileio import write_text_atomic
from bert_tf.pretrained import FinetuneError
from bert_tf.runners.common import mean_xent, run_finetuning, softmax
from bert_tf.runners.task import Featurized, FinetuneConfig, FinetuneTask
from bert_tf.tasks import glue
from bert_tf.tasks.windows import aggregate_windows, check_window_settings, window_weights

logger = logging.getLogger("bert_tf.classifier")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifierRunConfig(FinetuneConfig):
    task: glue.TaskSpec
    data_dir: str
    long_inputs: str = "truncate"  # or "windows"
    doc_stride: int = 128  # windows: each starts this many word pieces after the previous one
    window_aggregation: str = "mean"  # windows: "mean", "max" or "first" of the windows' logits


def classification_loss(model, batch, training):
    """Mean cross-entropy (or squared error for regression) over real examples; accuracy metric.

    batch["example_weights"] (float [B], windows: 1 / windows of the input) weighs each row when present."""
    logits = model(batch, training=training)  # [B, L] float32
    weights = tf.cast(batch.get("is_real_example", tf.ones_like(batch["label_ids"], tf.int32)), tf.float32)
    if "example_weights" in batch:
        weights *= tf.cast(batch["example_weights"], tf.float32)
    denominator = tf.maximum(tf.reduce_sum(weights), 1.0)
    if logits.shape[-1] == 1:
        error = tf.squeeze(logits, -1) - tf.cast(batch["label_ids"], tf.float32)
        loss = tf.reduce_sum(weights * tf.square(error)) / denominator
        return loss, {}
    labels = tf.cast(batch["label_ids"], tf.int32)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    loss = tf.reduce_sum(weights * xent) / denominator
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
    return loss, {"accuracy": (tf.reduce_sum(weights * correct) / denominator, tf.reduce_sum(weights))}


class ClassifierTask(FinetuneTask):
    """One GLUE-style task: logits [N, L] (L = 1: regression) over the pooled output."""

    def __init__(self, cfg: ClassifierRunConfig):
        check_window_settings(cfg.long_inputs, cfg.doc_stride, cfg.window_aggregation)
        self.cfg = cfg
        self.windows = cfg.long_inputs == "windows"
        self.spec = cfg.task
        self.task_type = "regression" if self.spec.is_regression else "classification"

    def setup(self, pretrained):
        if self.spec.labels is not None and not self.spec.labels:
            self.spec = glue.infer_labels(self.spec, self.cfg.data_dir)
        self.eval_splits, self.predict_splits = self.spec.eval_splits, self.spec.test_splits
        self.primary_metric = {"mcc": "eval_mcc", "pearson_spearman": "eval_corr",
                               "f1_accuracy": "eval_acc_and_f1"}.get(self.spec.metric, "eval_accuracy")
        windows = dict(doc_stride=self.cfg.doc_stride, window_aggregation=self.cfg.window_aggregation) \
            if self.windows else {}
        return TaskRecord(self.task_type, task=self.spec.name, label_list=tuple(self.spec.labels or ()),
                          long_inputs=self.cfg.long_inputs, **windows)

    def featurize(self, split, tokenizer):
        examples = self.spec.read_examples(self.cfg.data_dir, split)
        if not examples:
            raise FinetuneError(f"{os.path.join(self.cfg.data_dir, self.spec.split(split).filename)}: no examples")
        if not self.windows:
            features = glue.convert_examples_to_features(examples, self.spec.labels, self.cfg.max_seq_length,
                                                         tokenizer)
            return Featurized(examples, glue.features_to_arrays(features, self.cfg.max_seq_length), len(examples))
        features, window_example = glue.convert_examples_to_windows(
            examples, self.spec.labels, self.cfg.max_seq_length, tokenizer, self.cfg.doc_stride)
        arrays = glue.features_to_arrays(features, self.cfg.max_seq_length)
        arrays["example_weights"] = window_weights(window_example)
        logger.info("%s: %d inputs -> %d windows (max_seq_length %d, doc_stride %d)", split, len(examples),
                    len(features), self.cfg.max_seq_length, self.cfg.doc_stride)
        return Featurized(examples, arrays, len(features), window_example=np.asarray(window_example))

    loss = staticmethod(classification_loss)

    def per_input(self, data, logits):
        """(logits [N, L], label ids [N]): one row per input, the windows' logits aggregated."""
        if data.window_example is None:
            return logits, data.arrays["label_ids"]
        n = len(data.examples)
        labels = np.zeros(n, data.arrays["label_ids"].dtype)
        labels[data.window_example] = data.arrays["label_ids"]  # every window carries its input's label
        return aggregate_windows(logits, data.window_example, n, self.cfg.window_aggregation), labels

    def score(self, split, data, logits):
        logits, labels = self.per_input(data, logits)
        if split not in self.eval_splits:
            return None, logits
        if self.spec.is_regression:
            predictions = logits[:, 0]
            loss = float(np.mean((predictions - labels) ** 2))
        else:
            predictions = logits.argmax(-1)
            loss = mean_xent(logits, labels)
        results = {f"eval_{k}": v for k, v in self.spec.compute_metrics(predictions, labels).items()}
        results["eval_loss"] = loss
        return results, logits

    def write(self, output_dir, split, data, logits):
        if split not in self.predict_splits:
            return
        if self.spec.is_regression:
            outputs, predictions = logits, logits[:, 0]
        else:
            outputs, predictions = softmax(logits), logits.argmax(-1)
        suffix = "" if len(self.predict_splits) == 1 else f"_{split}"
        write_text_atomic(os.path.join(output_dir, f"test_results{suffix}.tsv"), glue.test_results_text(outputs))
        path = glue.write_glue_submission(output_dir, self.spec, split, data.examples, predictions)
        logger.info("wrote test_results%s.tsv and %s (%d examples)", suffix, os.path.basename(path), len(data.examples))

    def summary(self):
        summary = {"task": self.spec.name, "labels": ", ".join(self.spec.labels or ["(regression)"])}
        if self.windows:
            summary["long inputs"] = (f"windows every {self.cfg.doc_stride} word pieces, each weighted 1/windows "
                                      f"of its input; {self.cfg.window_aggregation} of their logits per input")
        return summary


def run(cfg: ClassifierRunConfig) -> Dict[str, Dict[str, float]]:
    """Trains / evaluates / predicts as asked; returns {eval split: results}."""
    return run_finetuning(ClassifierTask(cfg), cfg)


__all__ = ["ClassifierRunConfig", "ClassifierTask", "classification_loss", "run"]
