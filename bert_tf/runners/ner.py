"""Named-entity recognition fine-tuning on CoNLL-2003-format files (docs/reference.md §7).

The library side of run_ner.py: `run(NerRunConfig)` trains, evaluates and predicts on
`train.txt`, `valid.txt` (or `dev.txt`) and `test.txt` in data_dir (`word ... NER-tag`
per line, blank lines between sentences). As in the BERT paper, the first word piece
of each word carries the word's tag; the loss is the mean cross-entropy over those
pieces only. Scores are entity-level precision / recall / F1 with conlleval's
semantics (bert_tf.tasks.conll.conlleval).

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
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from bert_tf import finetuning
from bert_tf.configs import read_run_info, write_text_atomic
from bert_tf.models import BertTokenClassifier
from bert_tf.models.feature_extraction import parse_layer_combination
from bert_tf.models.feature_tagger import DEFAULT_FEATURE_LAYERS, BiLSTMFeatureTagger
from bert_tf.runners import common
from bert_tf.tasks import IGNORE_LABEL_ID, TaskDataError, conll
from bert_tf.tasks.glue import eval_results_text

logger = logging.getLogger("bert_tf.ner")

TASK_TYPE = "tagging"
TASK_NAME = "ner"
EVAL_SPLIT = "dev"
# The first file that exists is read for each split (valid.txt as in the common CoNLL-2003
# distribution; dev.txt as other NER tools name it).
SPLIT_FILES = {"train": ("train.txt",), "dev": ("valid.txt", "dev.txt"), "test": ("test.txt",)}


@dataclasses.dataclass(frozen=True)
class NerRunConfig:
    data_dir: str
    output_dir: str
    run: common.RunSettings
    labels: Optional[Tuple[str, ...]] = None  # None: the trained model's, else the tags of train.txt
    max_seq_length: int = 128
    do_lower_case: bool = True
    do_train: bool = False
    do_eval: bool = False
    do_predict: bool = False
    train_batch_size: int = 32
    eval_batch_size: int = 8
    predict_batch_size: int = 8
    num_train_epochs: float = 3.0
    warmup_proportion: float = 0.1
    eval_every_steps: int = 0  # 0: evaluate once after training
    feature_based: bool = False  # train a BiLSTM on frozen encoder features instead of fine-tuning
    feature_layers: str = DEFAULT_FEATURE_LAYERS  # how the frozen layers are combined (feature_based only)


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
    rows = logits[mask].astype(np.float64)  # [M, L]
    if not len(rows):
        return 0.0
    shifted = rows - rows.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-np.mean(log_probs[np.arange(len(rows)), label_ids[mask]]))


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
        raise TaskDataError(f"{path}: no sentences (expected 'word ... NER-tag' lines)")
    tagged = all(len(columns) >= 2 for e in examples for columns in e.columns)
    if split != "test" or tagged:
        examples = conll.read_conll(path, has_labels=True)
    return examples


@dataclasses.dataclass
class _Split:
    examples: List[conll.NerExample]
    features: List[conll.NerFeatures]
    arrays: Dict[str, np.ndarray]

    @property
    def tagged(self) -> bool:
        return self.examples[0].labels is not None


def _featurize(cfg: NerRunConfig, examples, labels: Sequence[str], tokenizer, labels_from: Optional[str]) -> _Split:
    try:
        features = conll.convert_examples_to_features(examples, labels, cfg.max_seq_length, tokenizer)
    except TaskDataError as e:
        if labels_from is None:
            raise
        raise TaskDataError(f"{e}; the tag set was read from {labels_from}: pass the full set with --labels") from None
    return _Split(examples, features, conll.features_to_arrays(features, cfg.max_seq_length))


def _resolve_labels(cfg: NerRunConfig, train_examples) -> Tuple[Tuple[str, ...], Optional[str]]:
    """(tag set in id order, the train file it came from or None).

    --labels, else the label list of the model in output_dir (eval/predict after training),
    else the tags of train.txt; when those are all CoNLL-2003 tags the model gets the whole
    CoNLL-2003 set, so a sample of the data still covers the dev and test tags.
    """
    if cfg.labels:
        if len(set(cfg.labels)) != len(cfg.labels):
            raise finetuning.FinetuneError(f"--labels has a repeated tag: {', '.join(cfg.labels)}")
        return tuple(cfg.labels), None
    info = read_run_info(cfg.output_dir) if tf.io.gfile.isdir(cfg.output_dir) else {}
    if not cfg.do_train and info.get("task_type") == TASK_TYPE and info.get("label_list"):
        return tuple(info["label_list"]), None
    if train_examples is None:
        train_examples = read_split(cfg.data_dir, "train")
    found = conll.label_list(train_examples)
    if set(found) <= set(conll.CONLL2003_LABELS):
        found = conll.CONLL2003_LABELS
    return tuple(found), split_path(cfg.data_dir, "train")


def run(cfg: NerRunConfig) -> Dict[str, Dict[str, float]]:
    """Trains / evaluates / predicts as asked; returns {"dev": eval results[, "test": test results]}."""
    common.check_request(cfg)
    settings = cfg.run
    pretrained = settings.pretrained
    tokenizer = pretrained.tokenizer(cfg.do_lower_case)

    # Every input is read and featurized before anything is written to output_dir.
    train_examples = read_split(cfg.data_dir, "train") if cfg.do_train else None
    labels, labels_from = _resolve_labels(cfg, train_examples)
    info = dict(task=TASK_NAME, label_list=list(labels))
    if cfg.feature_based:
        combination = parse_layer_combination(cfg.feature_layers).fit(pretrained.config.num_hidden_layers)
        combination.layer_indexes(pretrained.config.num_hidden_layers)  # bad index: one line, before any work
        info.update(feature_based=True, feature_layers=combination.spec)
    finetuning.check_output_dir_matches(cfg.output_dir, TASK_TYPE, **info)
    train = dev = test = None
    num_train_steps = 0
    if cfg.do_train:
        train = _featurize(cfg, train_examples, labels, tokenizer, None)
        num_train_steps = max(1, int(len(train.features) / cfg.train_batch_size * cfg.num_train_epochs))
    if cfg.do_eval or (cfg.do_train and cfg.eval_every_steps):
        dev = _featurize(cfg, read_split(cfg.data_dir, EVAL_SPLIT), labels, tokenizer, labels_from)
    if cfg.do_predict:
        test = _featurize(cfg, read_split(cfg.data_dir, "test"), labels, tokenizer, labels_from)

    def model_fn():
        if cfg.feature_based:
            return BiLSTMFeatureTagger(pretrained.build_encoder(), len(labels), combination)
        return BertTokenClassifier(pretrained.build_encoder(), num_labels=len(labels))

    trainer = common.make_trainer(settings, cfg.output_dir, model_fn, tagging_loss,
                                  num_train_steps=num_train_steps, global_batch_size=cfg.train_batch_size,
                                  warmup_proportion=cfg.warmup_proportion)
    finetuning.write_model_dir_files(cfg.output_dir, pretrained, do_lower_case=cfg.do_lower_case,
                                     max_seq_length=cfg.max_seq_length, task_type=TASK_TYPE, **info)

    def tag(split: _Split, batch_size: int):
        """-> (logits [N, S, L], predicted tags per word of every sentence)."""
        logits = finetuning.predict(trainer.model, split.arrays, batch_size, sequence_outputs=True,
                                    dynamic_padding=settings.dynamic_padding)
        predicted = conll.window_predictions_to_labels(split.examples, split.features, logits.argmax(-1), labels)
        return logits, predicted

    def score(split: _Split, logits, predicted, prefix: str) -> Dict[str, float]:
        scores = conll.conlleval([e.labels for e in split.examples], predicted)
        results = scores_to_results(scores, prefix)
        results[f"{prefix}_loss"] = masked_xent(logits, split.arrays["label_ids"])
        results["global_step"] = int(trainer.global_step.numpy())
        logger.info("%s at step %d: precision %.4f recall %.4f f1 %.4f (%d gold entities, %d predicted, %d correct)",
                    prefix, results["global_step"], scores["precision"], scores["recall"], scores["f1"],
                    scores["found_gold"], scores["found_predicted"], scores["correct"])
        return results

    last_dev_predictions = {}

    def evaluate() -> Dict[str, Dict[str, float]]:
        logits, predicted = tag(dev, cfg.eval_batch_size)
        last_dev_predictions["tags"] = predicted
        return {EVAL_SPLIT: score(dev, logits, predicted, "eval")}

    results: Dict[str, Dict[str, float]] = {}
    if cfg.do_train:
        trainer.run_summary(len(train.examples), int(num_train_steps * cfg.warmup_proportion),
                            extra={"task": "NER", "windows": len(train.features), "labels": ", ".join(labels)})
        dataset_fn = finetuning.arrays_dataset_fn(train.arrays, training=True, seed=settings.seed,
                                                  dynamic_padding=settings.dynamic_padding)
        results = common.train_with_periodic_eval(
            trainer, dataset_fn, num_train_steps, cfg.eval_every_steps if dev is not None else 0,
            evaluate, metric=(EVAL_SPLIT, "eval_f1"), output_dir=cfg.output_dir)
    else:
        trainer.restore()
    if cfg.do_eval:
        # An evaluation at the last step during training already gave these numbers.
        done = results and results[EVAL_SPLIT]["global_step"] == int(trainer.global_step.numpy())
        results = results if done else evaluate()
        write_text_atomic(os.path.join(cfg.output_dir, "eval_results.txt"), eval_results_text(results[EVAL_SPLIT]))
        conll.write_conll_predictions(os.path.join(cfg.output_dir, "eval_predictions.txt"), dev.examples,
                                      last_dev_predictions["tags"])
        logger.info("wrote eval_results.txt and eval_predictions.txt in %s", cfg.output_dir)
    if cfg.do_predict:
        logits, predicted = tag(test, cfg.predict_batch_size)
        if test.tagged:
            results["test"] = score(test, logits, predicted, "test")
            write_text_atomic(os.path.join(cfg.output_dir, "test_results.txt"), eval_results_text(results["test"]))
        conll.write_conll_predictions(os.path.join(cfg.output_dir, "test_predictions.txt"), test.examples, predicted)
        logger.info("wrote test_predictions.txt (%d sentences)", len(test.examples))
    return results


__all__ = ["NerRunConfig", "masked_xent", "read_split", "run", "scores_to_results", "tagging_loss"]
