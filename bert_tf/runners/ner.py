"""Named-entity recognition fine-tuning on CoNLL-2003-format files (docs/reference.md §7).

The library side of run_ner.py: `run(NerRunConfig)` trains, evaluates and predicts on
`train.txt`, `valid.txt` (or `dev.txt`) and `test.txt` in data_dir (`word ... NER-tag`
per line, blank lines between sentences). As in the BERT paper, the first word piece
of each word carries the word's tag; the loss is the mean cross-entropy over those
pieces only. Scores are entity-level precision / recall / F1 with conlleval's
semantics (bert_tf.tasks.conll.conlleval).

A sentence longer than max_seq_length becomes windows of whole words one after another, or
with `doc_stride` > 0 overlapping windows `doc_stride` pieces apart where each word is trained and
predicted in the window that gives it the most context (SQuAD's rule, bert_tf.tasks.windows).

With `feature_based` the encoder is not fine-tuned: a 2-layer BiLSTM tagger is
trained on its frozen features (the paper's feature-based approach, §5.3;
`feature_layers` says how layers are combined, concat_last:4 by default;
bert_tf.models.feature_tagger).

Files written to output_dir:
  eval_results.txt        eval_precision, eval_recall, eval_f1, eval_accuracy (token),
                          eval_loss, global_step, eval_<TYPE>_f1 per entity type
  eval_predictions.txt    the dev file with the predicted tag appended (word ... gold pred)
  test_predictions.txt    the same for test.txt (word pred when the test file has no tags)
  test_results.txt        test scores, when test.txt has tags

Dimensions: N windows, S max_seq_length, L labels.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from bert_tf.configs import TaskRecord, read_run_info
from bert_tf.errors import ConfigError, InputDataError
from bert_tf.models.feature_tagger import DEFAULT_FEATURE_LAYERS
from bert_tf.models.layer_combination import parse_layer_combination
from bert_tf.runners.common import mean_xent, run_finetuning
from bert_tf.runners.task import Featurized, FinetuneConfig, FinetuneTask
from bert_tf.tasks import IGNORE_LABEL_ID, conll

logger = logging.getLogger("bert_tf.ner")

TASK_NAME = "ner"
EVAL_SPLIT = "dev"
# The first file that exists is read for each split (valid.txt as in the common CoNLL-2003
# distribution; dev.txt as other NER tools name it).
SPLIT_FILES = {"train": ("train.txt",), "dev": ("valid.txt", "dev.txt"), "test": ("test.txt",)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class NerRunConfig(FinetuneConfig):
    data_dir: str
    labels: Optional[Tuple[str, ...]] = None  # None: the trained model's, else the tags of train.txt
    feature_based: bool = False  # train a BiLSTM on frozen encoder features instead of fine-tuning
    feature_layers: str = DEFAULT_FEATURE_LAYERS  # how the frozen layers are combined (feature_based only)
    doc_stride: int = 0  # > 0: overlapping windows this many pieces apart (0: whole-word windows, no overlap)


def tagging_loss(model, batch, training):
    """Mean cross-entropy over labelled pieces (label_ids != IGNORE_LABEL_ID); token accuracy on them.

    batch["label_ids"]: int32 [B, S]; model -> logits float32 [B, S, L].
    """
    logits = model(batch, training=training)  # [B, S, L]
    labels = tf.cast(batch["label_ids"], tf.int32)  # [B, S]
    weights = tf.cast(tf.not_equal(labels, IGNORE_LABEL_ID), tf.float32)
    safe_labels = tf.where(labels == IGNORE_LABEL_ID, tf.zeros_like(labels), labels)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=safe_labels, logits=logits)  # [B, S]
    count = tf.reduce_sum(weights)
    denominator = tf.maximum(count, 1.0)
    loss = tf.reduce_sum(weights * xent) / denominator
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), safe_labels), tf.float32)
    return loss, {"accuracy": (tf.reduce_sum(weights * correct) / denominator, count)}


def masked_xent(logits: np.ndarray, label_ids: np.ndarray) -> float:
    """logits float [N, S, L], label_ids int [N, S] -> mean cross-entropy over labelled positions."""
    mask = label_ids != IGNORE_LABEL_ID
    return mean_xent(logits[mask], label_ids[mask])


def scores_to_results(scores: Dict, prefix: str) -> Dict[str, float]:
    """conlleval's scores -> flat `<prefix>_precision/recall/f1/accuracy` and `<prefix>_<TYPE>_f1`."""
    results = {f"{prefix}_{k}": float(scores[k]) for k in ("precision", "recall", "f1", "accuracy")}
    for entity_type, type_scores in scores["per_type"].items():
        results[f"{prefix}_{entity_type}_f1"] = float(type_scores["f1"])
    return results


def split_path(data_dir: str, split: str) -> str:
    names = SPLIT_FILES[split]
    for name in names:
        path = os.path.join(data_dir, name)
        if tf.io.gfile.exists(path):
            return path
    return os.path.join(data_dir, names[0])  # reading it gives the one-line "cannot read" error


def read_split(data_dir: str, split: str) -> List[conll.NerExample]:
    """Sentences of one split. Train and dev must be tagged; test may be words only (one column)."""
    path = split_path(data_dir, split)
    examples = conll.read_conll(path, has_labels=False)
    if not examples:
        raise InputDataError(f"{path}: no sentences (expected 'word ... NER-tag' lines)")
    tagged = all(len(columns) >= 2 for e in examples for columns in e.columns)
    if split != "test" or tagged:
        examples = conll.read_conll(path, has_labels=True)
    return examples


def _resolve_labels(cfg: NerRunConfig, train_examples) -> Tuple[Tuple[str, ...], Optional[str]]:
    """(tag set in id order, the train file it came from or None).

    --labels, else the label list of the model in output_dir (eval/predict after training),
    else the tags of train.txt; when those are all CoNLL-2003 tags the model gets the whole
    CoNLL-2003 set, so a sample of the data still covers the dev and test tags.
    """
    if cfg.labels:
        if len(set(cfg.labels)) != len(cfg.labels):
            raise ConfigError(f"--labels has a repeated tag: {', '.join(cfg.labels)}")
        return tuple(cfg.labels), None
    info = read_run_info(cfg.output_dir) if tf.io.gfile.isdir(cfg.output_dir) else {}
    if not cfg.do_train and info.get("task_type") == NerTask.task_type and info.get("label_list"):
        return tuple(info["label_list"]), None
    if train_examples is None:
        train_examples = read_split(cfg.data_dir, "train")
    found = conll.label_list(train_examples)
    if set(found) <= set(conll.CONLL2003_LABELS):
        found = conll.CONLL2003_LABELS
    return tuple(found), split_path(cfg.data_dir, "train")


class NerTask(FinetuneTask):
    """Tags per word piece (logits [N, S, L]); the first piece of a word carries its tag."""

    task_type = "tagging"
    eval_splits = (EVAL_SPLIT,)
    predict_splits = ("test",)
    primary_metric = "eval_f1"
    sequence_outputs = True
    pack_pad_values = {"label_ids": IGNORE_LABEL_ID}  # no loss where a packed row has no token
    loss = staticmethod(tagging_loss)

    def __init__(self, cfg: NerRunConfig):
        if cfg.doc_stride < 0:
            raise ConfigError(f"--doc_stride must be positive (or 0: windows of whole words), got {cfg.doc_stride}")
        self.cfg = cfg
        if cfg.feature_based:
            self.not_packable = "the feature-based BiLSTM reads a whole row as one sentence"

    def setup(self, pretrained):
        cfg = self.cfg
        self.train_examples = read_split(cfg.data_dir, "train") if cfg.do_train else None
        self.labels, self.labels_from = _resolve_labels(cfg, self.train_examples)
        feature_layers = None
        if cfg.feature_based:
            layers = pretrained.config.num_hidden_layers
            combination = parse_layer_combination(cfg.feature_layers).fit(layers)
            combination.layer_indexes(layers)  # bad index: one line, before any work
            feature_layers = combination.spec
        return TaskRecord(self.task_type, task=TASK_NAME, label_list=tuple(self.labels),
                          feature_based=bool(cfg.feature_based), feature_layers=feature_layers,
                          doc_stride=cfg.doc_stride or None)

    def featurize(self, split, tokenizer):
        cfg = self.cfg
        examples = self.train_examples if split == "train" else read_split(cfg.data_dir, split)
        try:
            features = conll.convert_examples_to_features(examples, self.labels, cfg.max_seq_length, tokenizer,
                                                          doc_stride=cfg.doc_stride)
        except InputDataError as e:
            if split == "train" or self.labels_from is None:
                raise
            raise InputDataError(f"{e}; the tag set was read from {self.labels_from}: pass the full set with "
                                "--labels") from None
        return Featurized(examples, conll.features_to_arrays(features, cfg.max_seq_length), len(features), features)

    def score(self, split, data, logits):
        """-> (conlleval's scores when the split is tagged, predicted tags per word of every sentence)."""
        predicted = conll.window_predictions_to_labels(data.examples, data.features, logits.argmax(-1), self.labels)
        if data.examples[0].labels is None:
            return None, predicted
        prefix = "eval" if split == EVAL_SPLIT else split
        scores = conll.conlleval([e.labels for e in data.examples], predicted)
        results = scores_to_results(scores, prefix)
        results[f"{prefix}_loss"] = masked_xent(logits, data.arrays["label_ids"])
        logger.info("%s: %d gold entities, %d predicted, %d correct", prefix, scores["found_gold"],
                    scores["found_predicted"], scores["correct"])
        return results, predicted

    def write(self, output_dir, split, data, predicted):
        name = "eval_predictions.txt" if split == EVAL_SPLIT else f"{split}_predictions.txt"
        conll.write_conll_predictions(os.path.join(output_dir, name), data.examples, predicted)
        logger.info("wrote %s (%d sentences)", name, len(data.examples))

    def summary(self):
        return {"task": "NER", "sentences": len(self.train_examples), "labels": ", ".join(self.labels)}


def run(cfg: NerRunConfig) -> Dict[str, Dict[str, float]]:
    """Trains / evaluates / predicts as asked; returns {"dev": eval results[, "test": test results]}."""
    return run_finetuning(NerTask(cfg), cfg)


__all__ = ["NerRunConfig", "NerTask", "masked_xent", "read_split", "run", "scores_to_results", "tagging_loss"]
