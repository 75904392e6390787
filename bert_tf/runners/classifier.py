"""Sentence(-pair) classification and regression fine-tuning: GLUE, XNLI and your own TSV/CSV.

The library side of run_classifier.py: `run(ClassifierRunConfig)` trains, evaluates
and predicts, and writes the original's files (`eval_results.txt`,
`test_results.tsv`) plus GLUE submission files (`<TASK>.tsv`) into output_dir.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Dict, List

import numpy as np
import tensorflow as tf

from bert_tf import finetuning
from bert_tf.configs import write_text_atomic
from bert_tf.models import BertClassifier
from bert_tf.runners import common
from bert_tf.tasks import glue

logger = logging.getLogger("bert_tf.classifier")


@dataclasses.dataclass(frozen=True)
class ClassifierRunConfig:
    task: glue.TaskSpec
    data_dir: str
    output_dir: str
    run: common.RunSettings
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


def classification_loss(model, batch, training):
    """Mean cross-entropy (or squared error for regression) over real examples; accuracy metric."""
    logits = model(batch, training=training)  # [B, L] float32
    weights = tf.cast(batch.get("is_real_example", tf.ones_like(batch["label_ids"], tf.int32)), tf.float32)
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


def _features(cfg: ClassifierRunConfig, tokenizer, split: str):
    examples = cfg.task.read_examples(cfg.data_dir, split)
    if not examples:
        raise finetuning.FinetuneError(f"{os.path.join(cfg.data_dir, cfg.task.split(split).filename)}: no examples")
    features = glue.convert_examples_to_features(examples, cfg.task.labels, cfg.max_seq_length, tokenizer)
    return examples, glue.features_to_arrays(features, cfg.max_seq_length)


def _eval_metrics(cfg: ClassifierRunConfig, logits: np.ndarray, arrays) -> Dict[str, float]:
    labels = arrays["label_ids"]
    if cfg.task.is_regression:
        predictions = logits[:, 0]
        loss = float(np.mean((predictions - labels) ** 2))
    else:
        predictions = logits.argmax(-1)
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        loss = float(-np.mean(log_probs[np.arange(len(labels)), labels]))
    results = {f"eval_{k}": v for k, v in cfg.task.compute_metrics(predictions, labels).items()}
    results["eval_loss"] = loss
    return results


def _primary_metric(task: glue.TaskSpec) -> str:
    return {"mcc": "eval_mcc", "pearson_spearman": "eval_corr", "f1_accuracy": "eval_acc_and_f1"}.get(
        task.metric, "eval_accuracy")


def run(cfg: ClassifierRunConfig) -> Dict[str, Dict[str, float]]:
    """Trains / evaluates / predicts as asked; returns {eval split: results}."""
    common.check_request(cfg)
    settings = cfg.run
    pretrained = settings.pretrained
    task = cfg.task
    if task.labels is not None and not task.labels:
        task = glue.infer_labels(task, cfg.data_dir)
        cfg = dataclasses.replace(cfg, task=task)
    info = dict(task=task.name, label_list=list(task.labels or []))
    task_type = "regression" if task.is_regression else "classification"
    finetuning.check_output_dir_matches(cfg.output_dir, task_type, **info)
    tokenizer = pretrained.tokenizer(cfg.do_lower_case)

    train_examples = train_arrays = None
    num_train_steps = 0
    if cfg.do_train:
        train_examples, train_arrays = _features(cfg, tokenizer, "train")
        num_train_steps = max(1, int(len(train_examples) / cfg.train_batch_size * cfg.num_train_epochs))
    eval_sets = {}
    if cfg.do_eval or (cfg.do_train and cfg.eval_every_steps):
        for split in task.eval_splits:
            eval_sets[split] = _features(cfg, tokenizer, split)

    def model_fn():
        return BertClassifier(pretrained.build_encoder(), num_labels=task.num_labels,
                              skip_padding=not settings.jit_compile)

    trainer = common.make_trainer(settings, cfg.output_dir, model_fn, classification_loss,
                                  num_train_steps=num_train_steps, global_batch_size=cfg.train_batch_size,
                                  warmup_proportion=cfg.warmup_proportion)
    finetuning.write_model_dir_files(cfg.output_dir, pretrained, do_lower_case=cfg.do_lower_case,
                                     max_seq_length=cfg.max_seq_length, task_type=task_type, **info)

    def evaluate() -> Dict[str, Dict[str, float]]:
        all_results = {}
        step = int(trainer.global_step.numpy())
        for split, (_, arrays) in eval_sets.items():
            logits = finetuning.predict(trainer.model, arrays, cfg.eval_batch_size,
                                        dynamic_padding=settings.dynamic_padding)
            results = _eval_metrics(cfg, logits, arrays)
            results["global_step"] = step
            all_results[split] = results
            logger.info("eval %s at step %d: %s", split, step,
                        " ".join(f"{k} {v:.4f}" for k, v in sorted(results.items()) if k != "global_step"))
        return all_results

    results: Dict[str, Dict[str, float]] = {}
    if cfg.do_train:
        trainer.run_summary(len(train_examples), int(num_train_steps * cfg.warmup_proportion),
                            extra={"task": task.name, "labels": ", ".join(task.labels or ["(regression)"])})
        dataset_fn = finetuning.arrays_dataset_fn(train_arrays, training=True, seed=settings.seed,
                                                  dynamic_padding=settings.dynamic_padding)
        results = common.train_with_periodic_eval(
            trainer, dataset_fn, num_train_steps, cfg.eval_every_steps if eval_sets else 0,
            evaluate, metric=(task.eval_splits[0], _primary_metric(task)), output_dir=cfg.output_dir)
    else:
        trainer.restore()
    if cfg.do_eval:
        # An evaluation at the last step during training already gave these numbers.
        done = results and all(r.get("global_step") == int(trainer.global_step.numpy()) for r in results.values())
        results = results if done else evaluate()
        lines: List[str] = []
        for split, split_results in results.items():
            suffix = "" if len(results) == 1 else f"_{split}"
            name = f"eval_results{suffix}.txt"
            write_text_atomic(os.path.join(cfg.output_dir, name), glue.eval_results_text(split_results))
            lines.append(name)
        logger.info("wrote %s in %s", ", ".join(lines), cfg.output_dir)
    if cfg.do_predict:
        for split in task.test_splits:
            examples, arrays = _features(cfg, tokenizer, split)
            logits = finetuning.predict(trainer.model, arrays, cfg.predict_batch_size,
                                        dynamic_padding=settings.dynamic_padding)
            if task.is_regression:
                outputs, predictions = logits, logits[:, 0]
            else:
                outputs = tf.nn.softmax(logits, -1).numpy()
                predictions = logits.argmax(-1)
            suffix = "" if len(task.test_splits) == 1 else f"_{split}"
            write_text_atomic(os.path.join(cfg.output_dir, f"test_results{suffix}.tsv"),
                              glue.test_results_text(outputs))
            path = glue.write_glue_submission(cfg.output_dir, task, split, examples, predictions)
            logger.info("wrote test_results%s.tsv and %s (%d examples)", suffix, os.path.basename(path), len(examples))
    return results


__all__ = ["ClassifierRunConfig", "classification_loss", "run"]
