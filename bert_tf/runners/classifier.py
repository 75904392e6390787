"""Sentence(-pair) classification and regression fine-tuning: GLUE, XNLI and your own TSV/CSV.

The library side of run_classifier.py: `run(ClassifierRunConfig)` trains, evaluates
and predicts, and writes the original's files (`eval_results.txt`,
`test_results.tsv`) plus GLUE submission files (`<TASK>.tsv`) into output_dir.

Inputs longer than max_seq_length are truncated (`long_inputs="truncate"`, the original), or
cut into windows `doc_stride` pieces apart (`long_inputs="windows"`,
glue.convert_examples_to_windows). Evaluation and prediction turn the windows' logits into one
output per input (`window_aggregation`: mean, max, logmeanexp, any or first;
bert_tf.tasks.windows.aggregate_windows), so every output file keeps one row per input. Training
(`window_training`, by default the aggregation's bert_tf.tasks.windows.DEFAULT_WINDOW_TRAINING):
- "each": every window is a row with its input's label, weighted 1 / (windows of its input) so a
  long input weighs what a short one does;
- "aggregate": a row is one input with its windows in K slots (bert_tf.tasks.windows.windows_in_slots),
  the model scores them all and the loss is taken on their aggregation (window_slots.aggregate_slots), so the
  gradient reaches the window that decides (with max, only it), as in multiple-instance learning;
- "each_then_aggregate" and "each_then_calibrate": two stages in one run (run_in_two_stages): "each" into
  output_dir/each_window, then into output_dir from that model either "aggregate" for
  EACH_THEN_AGGREGATE_SHARE of the epochs, or no training and the output layer calibrated (the first label's
  logit shifted, every logit scaled) to fit the aggregate of training inputs' windows (calibrate_first_label);
- "clean_negatives": two stages too: inputs in slots into output_dir/clean_negatives, every window of an input
  of the first label ("found nowhere") trained as that label and another input's label on the aggregate of its
  windows (bert_tf.runners.window_slots.clean_negatives_loss), then that calibration into output_dir;
Not a `window_training` choice: run_select_stages, "each", then rounds of one epoch on the windows the current
model picks (bert_tf.tasks.windows.select_windows, ChosenWindowsTask), then that calibration; on the subtle needle
of docs/finetuning.md it stayed at chance (experiments/long_documents.py runs it, and the oracle it is measured
against).

"The first label" above is the absent label ("found nowhere", label id 0), which clean_negatives,
each_then_calibrate and `any` trust: with_ordered_labels puts it first (bert_tf.tasks.absent_label): the first of
labels listed in id order (--labels, a built-in task's), or `absent_label` first among labels read from train.tsv
(sorted), where a run that trusts it stops in one line when none is named; bert_tf_info.json records it
(`absent_label`, and label_list's order) for evaluation, prediction and the export.

What the head reads (`pooling`, resolve_pooling): the pooler at [CLS] as BERT does, or the mean of the last
layer's tokens, which a sentence-transformers checkpoint (all-MiniLM-L6-v2) was trained for and which its
folder's pooling config asks for; bert_tf_info.json records "mean".

Dimensions: B inputs, K window slots, S max_seq_length, L labels.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from bert_tf import fileio, model_dir, run_holder
from bert_tf.configs import TaskRecord, read_run_info
from bert_tf.errors import ConfigError
from bert_tf.fileio import write_text_atomic
from bert_tf.models.task_models import POOLINGS
from bert_tf.pretrained import resolve_pretrained
from bert_tf.runners import arrays
from bert_tf.runners.common import check_packing, make_trainer, mean_xent, run_finetuning, softmax
from bert_tf.runners.task import Featurized, FinetuneConfig, FinetuneTask
from bert_tf.runners.window_slots import clean_negatives_loss, slot_logits, window_slot_logits
from bert_tf.tasks import glue
from bert_tf.tasks.absent_label import order_labels, trusting_setting
from bert_tf.tasks.windows import (
    CALIBRATION_INPUTS,
    EACH_THEN_AGGREGATE_SHARE,
    FIRST_LABEL_TRAINING,
    SELECT_ROUNDS,
    SELECT_TOP,
    aggregate_windows,
    any_start_bias,
    check_window_settings,
    first_label_calibration,
    select_windows,
    window_training_for,
    window_weights,
    windows_in_slots,
)
from bert_tf.training.strategy import is_chief

logger = logging.getLogger("bert_tf.classifier")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifierRunConfig(FinetuneConfig):
    task: glue.TaskSpec
    data_dir: str
    long_inputs: str = "truncate"  # or "windows"
    doc_stride: int = 128  # windows: each starts this many word pieces after the previous one
    window_aggregation: str = "mean"  # windows: "mean", "max", "logmeanexp", "any" or "first" of the windows' logits
    window_training: Optional[str] = None  # windows: one of WINDOW_TRAINING; None: the aggregation's default
    pooling: Optional[str] = None  # "cls" or "mean" (POOLINGS); None: resolve_pooling's choice
    # The label meaning "found nowhere", which clean_negatives, each_then_calibrate and `any` trust (label id 0):
    # bert_tf.tasks.absent_label.order_labels puts it first; None: the first of listed labels, the recorded one.
    absent_label: Optional[str] = None


def resolve_pooling(asked: Optional[str], output_dir: str, pretrained) -> str:
    """The pooling of a classifier run: that of the run output_dir already holds (a rerun, an evaluation),
    else `asked`, else the starting checkpoint's own (Pretrained.pooling: a sentence-transformers folder
    that averages its tokens says "mean"), else "cls". Asking for another than the held run's is one line."""
    if asked is not None and asked not in POOLINGS:
        raise ConfigError(f"--pooling must be one of {', '.join(POOLINGS)}, got {asked!r}")
    info = read_run_info(output_dir)
    held = (info.get("pooling") or "cls") if info.get("task_type") in ("classification", "regression") and \
        model_dir.has_checkpoint(output_dir) else None
    if held and asked and asked != held:
        raise ConfigError(f"{output_dir}: holds a run trained with --pooling={held}, not {asked}; "
                            "use a new --output_dir")
    return held or asked or pretrained.pooling or "cls"


def classification_loss(model, batch, training, window_aggregation: str = "mean"):
    """Mean cross-entropy (or squared error for regression) over real examples; accuracy metric.

    batch["example_weights"] (float [B], windows: 1 / windows of the input) weighs each row when present.
    A batch with "window_mask" holds inputs in window slots: the loss is on their `window_aggregation`."""
    if "window_mask" in batch:
        logits = slot_logits(model, batch, training, window_aggregation)  # [B, L]
    else:
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

    def __init__(self, cfg: ClassifierRunConfig, recorded_training: Optional[str] = None):
        """recorded_training: what bert_tf_info.json says the model was trained by, when not this run's
        window_training alone (the aggregate stage of each_then_aggregate)."""
        check_window_settings(cfg.long_inputs, cfg.doc_stride, cfg.window_aggregation, cfg.window_training)
        self.cfg = cfg
        self.windows = cfg.long_inputs == "windows"
        self.window_training = window_training_for(cfg.window_aggregation, cfg.window_training) \
            if self.windows else None
        if cfg.task.is_regression and self.window_training in FIRST_LABEL_TRAINING:
            if cfg.window_training is not None:
                raise ConfigError(f"--window_training={self.window_training} needs labels, one meaning "
                                    "'found nowhere' (--absent_label); this task is a regression")
            self.window_training = "each"  # max's default, for a task with labels
        self.recorded_training = recorded_training or self.window_training
        if self.window_training in IN_SLOTS:
            self.not_packable = (f"--window_training={self.window_training} keeps each input's windows together "
                                 "in slots" + ("" if cfg.window_training else f" (--window_aggregation="
                                 f"{cfg.window_aggregation}'s default; --window_training=each_then_calibrate packs)"))
        self._train: Optional[Featurized] = None  # the train split, featurized once
        self.spec = cfg.task
        self.task_type = "regression" if self.spec.is_regression else "classification"
        self.pooling = cfg.pooling or "cls"  # resolved in setup
        if self.windows and cfg.window_aggregation == "any" and self.spec.is_regression:
            raise ConfigError("--window_aggregation=any needs labels (one meaning 'found nowhere': --absent_label); "
                                "this task is a regression")

    def _infer_labels(self):
        """The labels in the order the run uses, the absent label first (with_ordered_labels; once)."""
        if self.spec.labels is not None and not self.spec.labels:
            self.cfg = with_ordered_labels(self.cfg)
            self.spec = self.cfg.task

    def first_label(self) -> str:
        """The absent label ("found nowhere", label id 0) as logs quote it (a user task without --labels: the
        named one first among those read from its training file)."""
        self._infer_labels()
        return repr(self.spec.labels[0])

    def setup(self, pretrained):
        self._infer_labels()
        self.eval_splits, self.predict_splits = self.spec.eval_splits, self.spec.test_splits
        self.primary_metric = {"mcc": "eval_mcc", "pearson_spearman": "eval_corr",
                               "f1_accuracy": "eval_acc_and_f1"}.get(self.spec.metric, "eval_accuracy")
        # How the model was trained on windows: this run's when it trains, else what the training run recorded.
        trained = self.recorded_training if self.cfg.do_train else \
            read_run_info(self.cfg.output_dir).get("window_training")
        windows = dict(doc_stride=self.cfg.doc_stride, window_aggregation=self.cfg.window_aggregation) \
            if self.windows else {}
        self.pooling = resolve_pooling(self.cfg.pooling, self.cfg.output_dir, pretrained)
        return TaskRecord(self.task_type, task=self.spec.name, label_list=tuple(self.spec.labels or ()),
                          long_inputs=self.cfg.long_inputs, window_training=trained, **windows,
                          pooling="mean" if self.pooling == "mean" else None, absent_label=self.cfg.absent_label)

    def featurize(self, split, tokenizer):
        if split == "train" and self._train is not None:
            return self._train
        data = self._featurize(split, tokenizer)
        if split == "train":
            self._train = data
        return data

    def read_split(self, split):
        """`split`'s examples; InputDataError for a missing or malformed file, ConfigError for an empty one."""
        self._infer_labels()
        examples = self.spec.read_examples(self.cfg.data_dir, split)
        if not examples:
            raise ConfigError(f"{os.path.join(self.cfg.data_dir, self.spec.split(split).filename)}: no examples")
        return examples

    def _featurize(self, split, tokenizer):
        examples = self.read_split(split)
        if not self.windows:
            features = glue.convert_examples_to_features(examples, self.spec.labels, self.cfg.max_seq_length,
                                                         tokenizer)
            return Featurized(examples, glue.features_to_arrays(features, self.cfg.max_seq_length), len(examples))
        features, window_example = glue.convert_examples_to_windows(
            examples, self.spec.labels, self.cfg.max_seq_length, tokenizer, self.cfg.doc_stride)
        arrays = glue.features_to_arrays(features, self.cfg.max_seq_length)
        logger.info("%s: %d inputs -> %d windows (max_seq_length %d, doc_stride %d)", split, len(examples),
                    len(features), self.cfg.max_seq_length, self.cfg.doc_stride)
        if split == "train" and self.window_training in ("aggregate", "clean_negatives"):  # an input's windows in slots
            slots = windows_in_slots(arrays, window_example, per_input=("label_ids", "is_real_example"))
            mask = slots["window_mask"]
            logger.info("%s: %d window slots per input, %.1f%% of them empty", split, mask.shape[1],
                        100 * (1 - mask.mean()))
            return Featurized(examples, slots, len(examples), window_example=np.asarray(window_example))
        arrays["example_weights"] = window_weights(window_example)
        return Featurized(examples, arrays, len(features), window_example=np.asarray(window_example))

    def start_head(self, model, train):
        """Training on the aggregate under "any": the head's bias starts where the noisy-OR gives the first label
        its share of the training inputs (bert_tf.tasks.windows.any_start_bias). Not in each_then_aggregate's
        second stage, whose head is the first stage's."""
        if self.window_training != "aggregate" or self.cfg.window_aggregation != "any" or \
                self.recorded_training == "each_then_aggregate":
            return
        real = train.arrays["is_real_example"] > 0
        share = float(np.mean(train.arrays["label_ids"][real] == 0))
        windows = float(train.arrays["window_mask"][real].sum(axis=1).mean())
        bias = any_start_bias(share, windows, len(self.spec.labels))
        model.head.projection.output_bias.assign(bias)
        logger.info("any: the head starts with bias %s (%.0f%% of the training inputs are %r, %.1f windows each)",
                    np.array2string(bias, precision=3), 100 * share, self.spec.labels[0], windows)

    def loss(self, model, batch, training):
        if self.window_training == "clean_negatives" and "window_mask" in batch:
            weights = batch.get("is_real_example", tf.ones_like(batch["label_ids"]))
            loss, accuracy = clean_negatives_loss(window_slot_logits(model, batch, training), batch["window_mask"],
                                                  batch["label_ids"], weights, self.cfg.window_aggregation)
            return loss, {"accuracy": (accuracy, tf.reduce_sum(tf.cast(weights, tf.float32)))}
        return classification_loss(model, batch, training, window_aggregation=self.cfg.window_aggregation)

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
        summary = {"task": self.spec.name, "labels": ", ".join(self.spec.labels or ["(regression)"]),
                   "reads": "the mean of the last layer's tokens" if self.pooling == "mean" else "the pooler at [CLS]"}
        if self.windows:
            first = repr(self.spec.labels[0]) if self.spec.labels else "the first label"
            each, slots = "each weighted 1/windows of its input", "an input's windows in one row of slots"
            training = {"each": each, "aggregate": f"trained on their aggregate, {slots}",
                        "each_then_calibrate": f"{each} ({EACH_WINDOW_DIR}/), then calibrated",
                        "each_then_aggregate": f"{each} ({EACH_WINDOW_DIR}/), then their aggregate",
                        "clean_negatives": f"every window of a {first} input trained as {first}, another input's "
                                           f"aggregate ({CLEAN_NEGATIVES_DIR}/), then calibrated"}[self.window_training]
            if self.window_training == "aggregate" and self.recorded_training == "each_then_aggregate":
                training += f", from the model trained on each window ({EACH_WINDOW_DIR}/)"
            summary["long inputs"] = (f"windows every {self.cfg.doc_stride} word pieces, {training}; "
                                      f"{self.cfg.window_aggregation} of their logits per input")
        return summary


class ChosenWindowsTask(ClassifierTask):
    """Trains on chosen windows of the training inputs, each row one window with its own label and weight 1:
    a round of each_then_select (select_windows' choice), or an oracle that knows which windows hold the
    evidence (experiments/long_documents.py). Evaluation and prediction are ClassifierTask's, on every window.

    rows int [R]: indices into the training split's windows (glue.convert_examples_to_windows' order);
    labels int [R]: their label ids."""

    def __init__(self, cfg: ClassifierRunConfig, rows, labels, recorded_training: str):
        super().__init__(dataclasses.replace(cfg, window_training="each"), recorded_training=recorded_training)
        self.rows, self.labels = np.asarray(rows, np.int64), np.asarray(labels, np.int64)
        if self.rows.shape != self.labels.shape or not self.windows:
            raise ValueError("ChosenWindowsTask needs long_inputs='windows' and one label per chosen row")

    def _featurize(self, split, tokenizer):
        data = super()._featurize(split, tokenizer)
        if split != "train":
            return data
        if len(self.rows) and self.rows.max() >= data.count:
            raise ValueError(f"chosen window {self.rows.max()} of a training split of {data.count} windows")
        chosen = {k: np.asarray(v)[self.rows] for k, v in data.arrays.items()}
        chosen["label_ids"] = self.labels.astype(chosen["label_ids"].dtype)
        chosen["example_weights"] = np.ones(len(self.rows), np.float32)
        return Featurized(data.examples, chosen, len(self.rows), window_example=data.window_example[self.rows])

    def summary(self):
        summary = super().summary()
        summary["long inputs"] = (f"windows every {self.cfg.doc_stride} word pieces, {len(self.rows)} chosen ones "
                                  f"each with its own label; {self.cfg.window_aggregation} of their logits per input")
        return summary


# The window trainings that train on inputs in window slots (in some stage): not packable, no auxiliary LM.
IN_SLOTS = ("aggregate", "each_then_aggregate", "clean_negatives")
# The window trainings that run in two stages: the first trains each window alone into EACH_WINDOW_DIR, or
# clean_negatives into CLEAN_NEGATIVES_DIR (both inside output_dir); the second trains or calibrates into output_dir.
TWO_STAGES = ("each_then_aggregate", "each_then_calibrate", "clean_negatives")
EACH_WINDOW_DIR, CLEAN_NEGATIVES_DIR = "each_window", "clean_negatives"


def with_ordered_labels(cfg: ClassifierRunConfig) -> ClassifierRunConfig:
    """cfg with its task's labels in the order the run uses (bert_tf.tasks.absent_label.order_labels: the absent
    label first) and, where the window settings trust it or it is named, absent_label set to it. Named:
    cfg.absent_label, else what output_dir's bert_tf_info.json records, else the first of listed labels;
    a run that trusts it with labels read from train.tsv and none named is a one-line ConfigError."""
    trusted_by = trusting_setting(cfg.long_inputs, cfg.window_aggregation, cfg.window_training)
    try:
        spec = order_labels(cfg.task, cfg.data_dir, cfg.absent_label, trusted_by,
                            read_run_info(cfg.output_dir).get("absent_label"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    absent = spec.labels[0] if spec.labels and (trusted_by or cfg.absent_label) else None
    return dataclasses.replace(cfg, task=spec, absent_label=absent)


def run(cfg: ClassifierRunConfig) -> Dict[str, Dict[str, float]]:
    """Trains / evaluates / predicts as asked; returns {eval split: results}."""
    cfg = with_ordered_labels(cfg)  # before any work: a needed absent label that is not named is one line
    task = ClassifierTask(cfg)
    if task.window_training in IN_SLOTS and cfg.do_train and cfg.run is not None and cfg.run.aux_lm_weight:
        raise ConfigError(f"--aux_lm_weight cannot be combined with --window_training={task.window_training}")
    if task.window_training in TWO_STAGES and cfg.do_train:
        if cfg.early_stopping:
            raise ConfigError(f"--early_stopping does not apply to --window_training={task.window_training}: "
                                "its stages train without evaluating")
        if cfg.run is not None:  # what the second stage would refuse, refused before the first trains
            check_packing(task, cfg.run)
            pretrained = cfg.run.pretrained
            record = dataclasses.replace(task.setup(pretrained), causal_attention=pretrained.causal)
            model_dir.check_matches(cfg.output_dir, record, pretrained.config)
        # The files the second stage scores, read now: a missing or malformed one is one line, not an
        # error after the first stage has trained (the one-stage run featurizes every split first).
        for split in (task.spec.eval_splits if cfg.do_eval else ()) + (task.spec.test_splits if cfg.do_predict else ()):
            task.read_split(split)
        held = read_run_info(cfg.output_dir).get("window_training")
        if model_dir.has_checkpoint(cfg.output_dir) and held != task.window_training:
            raise ConfigError(f"{cfg.output_dir}: holds a run with window_training={held!r}, not "
                                f"{task.window_training!r}; use a new --output_dir")
        with _holding(cfg):  # output_dir held across both stages, not only while each one trains
            return run_in_two_stages(cfg, task.window_training)
    return run_finetuning(task, cfg)


def _holding(cfg: ClassifierRunConfig):
    """A staged run's hold on output_dir (bert_tf/run_holder.py); its stages' run_finetuning calls hold
    their own folders inside it, and the last stage's on output_dir shares this hold."""
    return run_holder.holding(cfg.output_dir, chief=cfg.run is None or is_chief(cfg.run.strategy))


def run_in_two_stages(cfg: ClassifierRunConfig, training: str) -> Dict[str, Dict[str, float]]:
    """--window_training=each_then_aggregate, each_then_calibrate or clean_negatives: two stages in one run, each
    resumable.

    1. each window alone for num_train_epochs into output_dir/each_window (a complete model directory;
       no evaluation, no prediction): windows with the evidence learn it, but the others lean toward their
       input's label too, so an aggregate such as max or any of them is badly calibrated; or, clean_negatives,
       inputs in window slots for num_train_epochs into output_dir/clean_negatives, the loss
       clean_negatives_loss (every window of a first-label input is that label, another input's label goes to
       the aggregate of its windows), train_batch_size / (the mean windows per input) inputs per batch;
    2. into output_dir, from that model:
       - each_then_aggregate: the aggregate of each input's windows for EACH_THEN_AGGREGATE_SHARE x
         num_train_epochs, train_batch_size / (the mean windows per input) inputs per batch (about the
         windows of a first-stage batch);
       - each_then_calibrate and clean_negatives: no training; the first label's logit shifted and every logit
         scaled (first_label_calibration), fitted on the aggregate of at most CALIBRATION_INPUTS training inputs
         (calibrate_first_label).
    Evaluation, prediction and the export read output_dir's model. A rerun trains what is left."""
    if training == "clean_negatives":
        first = os.path.join(cfg.output_dir, CLEAN_NEGATIVES_DIR)
        stage = dataclasses.replace(cfg, output_dir=first, do_eval=False, do_predict=False, eval_every_steps=0)
        task = ClassifierTask(stage)
        first_label = task.first_label()
        train_in_slots(task, stage, f"{training}, stage 1 of 2", f"every window of a {first_label} input as "
                       f"{first_label}, another input's {cfg.window_aggregation}")
        return calibrate_and_score(cfg, first, training)
    first = train_each_window(cfg, training, "1 of 2")
    if training == "each_then_calibrate":
        return calibrate_and_score(cfg, first, training)
    pretrained = resolve_pretrained(first)
    from_first = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, pretrained=pretrained))
    aggregate = dataclasses.replace(from_first, window_training="aggregate",
                                    num_train_epochs=cfg.num_train_epochs * EACH_THEN_AGGREGATE_SHARE)
    return train_in_slots(ClassifierTask(aggregate, recorded_training="each_then_aggregate"), aggregate,
                          f"{training}, stage 2 of 2", f"their aggregate from {first}")


def train_in_slots(task: ClassifierTask, cfg: ClassifierRunConfig, stage: str, what: str):
    """run_finetuning of a task that trains on inputs in window slots, train_batch_size / (the mean windows per
    training input) inputs per batch: about the windows of a batch of each window alone."""
    train = task.featurize("train", cfg.run.pretrained.tokenizer(cfg.do_lower_case))
    windows = float(train.arrays["window_mask"].sum(axis=1).mean())
    batch = max(1, round(cfg.train_batch_size / windows))
    logger.info("%s: %s for %g epoch(s), %d inputs per batch (%.1f windows each) -> %s", stage, what,
                cfg.num_train_epochs, batch, windows, cfg.output_dir)
    return run_finetuning(task, dataclasses.replace(cfg, train_batch_size=batch))


# Where each_then_select's round r (1, 2, ...) trains, inside output_dir, and the windows it chose (row, label).
SELECT_DIR, SELECTED_FILE = "select_{}", "selected_windows.json"


def run_select_stages(cfg: ClassifierRunConfig, rounds: int = SELECT_ROUNDS,
                      top: int = SELECT_TOP) -> Dict[str, Dict[str, float]]:
    """Top-k window selection (multiple-instance learning), "each_then_select" in the logs and bert_tf_info.json;
    not a --window_training choice (measured at chance on the subtle needle: docs/finetuning.md). Each stage resumable.

    1. each window alone for num_train_epochs into output_dir/each_window (train_each_window): the warm start,
       which must already rank the evidence's windows above the others (on the subtle needle it did not: the
       rounds then picked random windows and stayed at chance);
    2. `rounds` rounds into output_dir/select_<r>, each from the previous stage's model: every training window
       scored, then one epoch on `top` windows of each input (select_windows: a "yes" input's most "yes"
       windows labelled yes, a "no" input's most "yes" windows labelled no), the choice kept in SELECTED_FILE;
    3. output_dir: the last round's model with the first label's bias calibrated (as each_then_calibrate).
    Each window trained alone with its input's label learns little where the evidence is subtle (~7 of a "yes"
    document's ~8 windows carry a label they have no evidence for); a round trains on the windows that decide
    a max. Returns what calibrate_and_score does."""
    stages = rounds + 2
    with _holding(cfg):
        previous = train_each_window(cfg, "each_then_select", f"1 of {stages}")
        for r in range(1, rounds + 1):
            previous = train_selected_round(cfg, previous, r, top, f"{r + 1} of {stages}")
        return calibrate_and_score(cfg, previous, "each_then_select", f"{stages} of {stages}")


def train_selected_round(cfg: ClassifierRunConfig, previous: str, r: int, top: int, stage: str) -> str:
    """One round of each_then_select from the model in folder `previous` into output_dir/select_<r>; returns it."""
    out = os.path.join(cfg.output_dir, SELECT_DIR.format(r))
    pretrained = resolve_pretrained(previous)
    stage_cfg = dataclasses.replace(cfg, output_dir=out, run=dataclasses.replace(cfg.run, pretrained=pretrained),
                                    window_training="each", do_eval=False, do_predict=False, eval_every_steps=0,
                                    num_train_epochs=1.0)
    chosen_path = os.path.join(out, SELECTED_FILE)
    if fileio.exists(chosen_path):  # a rerun: the round's choice was made from `previous`, which has not changed
        with fileio.open_file(chosen_path) as f:
            rows, labels = np.asarray(json.load(f), np.int64).reshape(-1, 2).T
    else:
        task = ClassifierTask(stage_cfg, recorded_training="each_then_select")
        train = task.featurize("train", pretrained.tokenizer(cfg.do_lower_case))
        window_example = np.asarray(train.window_example)
        _, _, logits = window_logits(stage_cfg, task, train, np.arange(len(window_example)))
        input_labels = np.zeros(len(train.examples), np.int64)
        input_labels[window_example] = train.arrays["label_ids"]
        rows, labels = select_windows(logits, window_example, input_labels, top)
        write_text_atomic(chosen_path, json.dumps(np.stack([rows, labels], 1).tolist()))
    logger.info("each_then_select, stage %s: one epoch on %d windows (the top %d of each input by the model of %s, "
                "%d of them labelled %r) -> %s", stage, len(rows), top, previous, int((labels == 0).sum()),
                cfg.task.labels[0] if cfg.task.labels else 0, out)
    run_finetuning(ChosenWindowsTask(stage_cfg, rows, labels, "each_then_select"), stage_cfg)
    return out


def train_each_window(cfg: ClassifierRunConfig, training: str, stage: str) -> str:
    """The first stage of a staged window training: each window alone for num_train_epochs into
    output_dir/EACH_WINDOW_DIR (no evaluation, no prediction; a rerun trains what is left). Returns that folder."""
    first = os.path.join(cfg.output_dir, EACH_WINDOW_DIR)
    logger.info("%s, stage %s: each window alone for %g epoch(s) -> %s", training, stage, cfg.num_train_epochs, first)
    each = dataclasses.replace(cfg, output_dir=first, window_training="each", do_eval=False, do_predict=False,
                               eval_every_steps=0)
    run_finetuning(ClassifierTask(each), each)
    return first


def calibrate_and_score(cfg: ClassifierRunConfig, last: str, training: str,
                        stage: str = "2 of 2") -> Dict[str, Dict[str, float]]:
    """The last stage: output_dir gets the model of folder `last` calibrated (calibrate_first_label, recorded as
    trained by `training`), which then evaluates and predicts as cfg asks."""
    pretrained = resolve_pretrained(last)
    from_last = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, pretrained=pretrained))
    calibrate_first_label(from_last, last, training, stage)
    if not (cfg.do_eval or cfg.do_predict):
        return {}
    scoring = dataclasses.replace(from_last, do_train=False)
    return run_finetuning(ClassifierTask(scoring), scoring)


def window_logits(cfg: ClassifierRunConfig, task: ClassifierTask, train: Featurized, rows: np.ndarray):
    """(trainer, its task record, logits float [R, L]): the training windows `rows` scored by the model
    cfg.run.pretrained reads (a finished stage's folder, head included), in a trainer on cfg.output_dir, which
    has no checkpoint yet."""
    settings = cfg.run
    pretrained = settings.pretrained
    record = dataclasses.replace(task.setup(pretrained), causal_attention=pretrained.causal)
    jit = settings.train.jit_compile
    trainer = make_trainer(settings, cfg.output_dir, lambda: pretrained.build_model(record, skip_padding=not jit),
                           task.loss, num_train_steps=1, global_batch_size=cfg.train_batch_size, warmup_proportion=0.0)
    trainer.restore()  # output_dir has no checkpoint: the stage's model, head included
    predictor = arrays.Predictor(trainer.model, dynamic_padding=settings.dynamic_padding and not jit,
                                 jit_compile=jit, strategy=settings.strategy)
    names = ("input_ids", "input_mask", "segment_ids")
    return trainer, record, predictor({k: train.arrays[k][rows] for k in names}, cfg.eval_batch_size)


def calibrate_first_label(cfg: ClassifierRunConfig, first: str, training: str = "each_then_calibrate",
                          stage: str = "2 of 2") -> None:
    """each_then_calibrate's and clean_negatives' second stage: output_dir gets the model of `first` (the first
    stage, at its last step; cfg.run.pretrained reads it) with its output layer calibrated: the first label's
    logit shifted and every logit scaled (first_label_calibration, Platt scaling), fitted on the
    --window_aggregation of the windows of at most CALIBRATION_INPUTS training inputs (drawn with the run's seed). Side files first, then a
    checkpoint at the first stage's step; an output_dir that has one is left as it is (a rerun)."""
    out = cfg.output_dir
    if model_dir.has_checkpoint(out):
        logger.info("%s, stage %s: %s holds the calibrated model", training, stage, out)
        return
    settings = cfg.run
    pretrained = settings.pretrained
    task = ClassifierTask(dataclasses.replace(cfg, window_training="each"), recorded_training=training)
    train = task.featurize("train", pretrained.tokenizer(cfg.do_lower_case))
    window_example = np.asarray(train.window_example)
    inputs = len(train.examples)
    rng = np.random.default_rng(0 if settings.train.seed is None else settings.train.seed)
    chosen = np.sort(rng.choice(inputs, size=min(inputs, CALIBRATION_INPUTS), replace=False))
    rows = np.flatnonzero(np.isin(window_example, chosen))
    trainer, record, logits = window_logits(cfg, task, train, rows)
    renumbered = np.searchsorted(chosen, window_example[rows])
    labels = np.zeros(len(chosen), np.int64)
    labels[renumbered] = train.arrays["label_ids"][rows]
    shift, scale = first_label_calibration(logits, renumbered, labels, cfg.window_aggregation)
    projection = trainer.model.head.projection
    first_label = np.eye(1, projection.output_bias.shape[0], dtype=np.float32)[0]
    projection.output_weights.assign(projection.output_weights * scale)  # scale * (W x + b + shift on label 0)
    projection.output_bias.assign((projection.output_bias + shift * first_label) * scale)
    step = model_dir.checkpoint_step(model_dir.latest_checkpoint(first))
    trainer.global_step.assign(step)
    logger.info("%s, stage %s: the %r logit of every window shifted by %+.3f and every logit scaled by %.3g, "
                "fitted on the %s of the windows of %d training inputs -> %s (step %d)", training, stage,
                task.spec.labels[0], shift, scale, cfg.window_aggregation, len(chosen), out, step)
    if trainer.is_chief:
        model_dir.write_finetuned(out, pretrained.config, pretrained.vocab_file, record,
                                  do_lower_case=cfg.do_lower_case, max_seq_length=cfg.max_seq_length)
    trainer.checkpoints.save(trainer.checkpoints.manager(), step)


__all__ = ["CLEAN_NEGATIVES_DIR", "EACH_WINDOW_DIR", "SELECT_DIR", "TWO_STAGES", "ChosenWindowsTask", "ClassifierRunConfig",
           "ClassifierTask", "calibrate_and_score", "calibrate_first_label", "classification_loss",
           "resolve_pooling", "run", "run_in_two_stages", "run_select_stages"]
