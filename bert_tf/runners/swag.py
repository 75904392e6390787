"""SWAG multiple-choice fine-tuning (docs/reference.md §3, §7).

The library side of run_swag.py: `run(SwagRunConfig)` trains, evaluates and predicts
on the SWAG CSVs (`train.csv`, `val.csv`, `test.csv` in data_dir). Each example's four
`[CLS] sent1 [SEP] sent2 ending_k [SEP]` sequences are encoded separately, scored by one
vector on the pooled output, and the softmax is over the four choices. Writes
`eval_results.txt` (eval_accuracy, eval_loss, global_step) and `test_results.csv`
(id, the four choice probabilities, the predicted ending).

Dimensions: N examples, C = swag.NUM_CHOICES, S max_seq_length.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Dict

import numpy as np

from bert_tf import finetuning
from bert_tf.configs import write_text_atomic
from bert_tf.models import BertMultipleChoice
from bert_tf.runners import common
from bert_tf.runners.classifier import classification_loss
from bert_tf.tasks import TaskDataError, swag
from bert_tf.tasks.glue import eval_results_text

logger = logging.getLogger("bert_tf.swag")

TASK_TYPE = "multiple_choice"
EVAL_SPLIT = "dev"  # val.csv
PREDICTIONS_FILE = "test_results.csv"
SPLIT_FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}


@dataclasses.dataclass(frozen=True)
class SwagRunConfig:
    data_dir: str
    output_dir: str
    run: common.RunSettings
    max_seq_length: int = 128
    do_lower_case: bool = True
    do_train: bool = False
    do_eval: bool = False
    do_predict: bool = False
    train_batch_size: int = 16  # the paper's SWAG setting (batch 16, lr 2e-5, 3 epochs)
    eval_batch_size: int = 8
    predict_batch_size: int = 8
    num_train_epochs: float = 3.0
    warmup_proportion: float = 0.1
    eval_every_steps: int = 0  # 0: evaluate once after training


# Multiple choice is classification over the choices: logits [B, C], label_ids [B] -> mean
# softmax cross-entropy and accuracy, exactly the classifier's loss.
multiple_choice_loss = classification_loss


def _features(cfg: SwagRunConfig, tokenizer, split: str):
    """(examples, arrays [N, C, S] + label_ids [N]) of one split; train/dev must carry labels."""
    path = os.path.join(cfg.data_dir, SPLIT_FILES[split])
    examples = swag.read_swag_examples(path, has_labels=True if split != "test" else None)
    if not examples:
        raise TaskDataError(f"{path}: no examples (expected SWAG rows after the header)")
    features = swag.convert_examples_to_features(examples, cfg.max_seq_length, tokenizer)
    return examples, swag.features_to_arrays(features, cfg.max_seq_length)


def softmax(logits: np.ndarray) -> np.ndarray:
    """float [N, C] -> probabilities over the last axis."""
    shifted = logits - logits.max(-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(-1, keepdims=True)


def eval_metrics(logits: np.ndarray, label_ids: np.ndarray) -> Dict[str, float]:
    """logits float [N, C], label_ids int [N] -> eval_accuracy and eval_loss (mean cross-entropy)."""
    log_probs = np.log(np.maximum(softmax(logits.astype(np.float64)), 1e-30))
    loss = float(-np.mean(log_probs[np.arange(len(label_ids)), label_ids]))
    accuracy = float(np.mean(logits.argmax(-1) == label_ids))
    return {"eval_accuracy": accuracy, "eval_loss": loss}


def run(cfg: SwagRunConfig) -> Dict[str, Dict[str, float]]:
    """Trains / evaluates / predicts as asked; returns {"dev": eval results} when evaluated."""
    common.check_request(cfg)
    settings = cfg.run
    pretrained = settings.pretrained
    info = dict(task="swag", num_choices=swag.NUM_CHOICES)
    finetuning.check_output_dir_matches(cfg.output_dir, TASK_TYPE, **info)
    tokenizer = pretrained.tokenizer(cfg.do_lower_case)

    # Every input is read and featurized before anything is written to output_dir.
    train_examples = train_arrays = None
    num_train_steps = 0
    if cfg.do_train:
        train_examples, train_arrays = _features(cfg, tokenizer, "train")
        num_train_steps = max(1, int(len(train_examples) / cfg.train_batch_size * cfg.num_train_epochs))
    eval_arrays = None
    if cfg.do_eval or (cfg.do_train and cfg.eval_every_steps):
        _, eval_arrays = _features(cfg, tokenizer, EVAL_SPLIT)
    test = _features(cfg, tokenizer, "test") if cfg.do_predict else None

    def model_fn():
        return BertMultipleChoice(pretrained.build_encoder(), num_choices=swag.NUM_CHOICES,
                                  skip_padding=not settings.jit_compile)

    trainer = common.make_trainer(settings, cfg.output_dir, model_fn, multiple_choice_loss,
                                  num_train_steps=num_train_steps, global_batch_size=cfg.train_batch_size,
                                  warmup_proportion=cfg.warmup_proportion)
    finetuning.write_model_dir_files(cfg.output_dir, pretrained, do_lower_case=cfg.do_lower_case,
                                     max_seq_length=cfg.max_seq_length, task_type=TASK_TYPE, **info)

    def logits_of(arrays, batch_size):
        return finetuning.predict(trainer.model, arrays, batch_size, dynamic_padding=settings.dynamic_padding)

    def evaluate() -> Dict[str, Dict[str, float]]:
        results = eval_metrics(logits_of(eval_arrays, cfg.eval_batch_size), eval_arrays["label_ids"])
        results["global_step"] = int(trainer.global_step.numpy())
        logger.info("eval %s at step %d: accuracy %.4f loss %.4f", EVAL_SPLIT, results["global_step"],
                    results["eval_accuracy"], results["eval_loss"])
        return {EVAL_SPLIT: results}

    results: Dict[str, Dict[str, float]] = {}
    if cfg.do_train:
        trainer.run_summary(len(train_examples), int(num_train_steps * cfg.warmup_proportion),
                            extra={"task": f"SWAG ({swag.NUM_CHOICES} choices)"})
        dataset_fn = finetuning.arrays_dataset_fn(train_arrays, training=True, seed=settings.seed,
                                                  dynamic_padding=settings.dynamic_padding)
        results = common.train_with_periodic_eval(
            trainer, dataset_fn, num_train_steps, cfg.eval_every_steps if eval_arrays is not None else 0,
            evaluate, metric=(EVAL_SPLIT, "eval_accuracy"), output_dir=cfg.output_dir)
    else:
        trainer.restore()
    if cfg.do_eval:
        # An evaluation at the last step during training already gave these numbers.
        done = results and results[EVAL_SPLIT]["global_step"] == int(trainer.global_step.numpy())
        results = results if done else evaluate()
        write_text_atomic(os.path.join(cfg.output_dir, "eval_results.txt"), eval_results_text(results[EVAL_SPLIT]))
        logger.info("wrote eval_results.txt in %s", cfg.output_dir)
    if cfg.do_predict:
        examples, arrays = test
        probabilities = softmax(logits_of(arrays, cfg.predict_batch_size))
        write_text_atomic(os.path.join(cfg.output_dir, PREDICTIONS_FILE), swag.predictions_text(examples, probabilities))
        logger.info("wrote %s (%d examples)", PREDICTIONS_FILE, len(examples))
    return results


__all__ = ["SwagRunConfig", "eval_metrics", "multiple_choice_loss", "run", "softmax"]
