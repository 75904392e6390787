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

from bert_tf.configs import TaskRecord
from bert_tf.errors import InputDataError
from bert_tf.fileio import write_text_atomic
from bert_tf.runners.classifier import classification_loss
from bert_tf.runners.common import mean_xent, run_finetuning, softmax
from bert_tf.runners.task import Featurized, FinetuneConfig, FinetuneTask
from bert_tf.tasks import swag

logger = logging.getLogger("bert_tf.swag")

EVAL_SPLIT = "dev"  # val.csv
PREDICTIONS_FILE = "test_results.csv"
SPLIT_FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SwagRunConfig(FinetuneConfig):
    data_dir: str
    train_batch_size: int = 16  # the paper's SWAG setting (batch 16, lr 2e-5, 3 epochs)


# Multiple choice is classification over the choices: logits [B, C], label_ids [B] -> mean
# softmax cross-entropy and accuracy, exactly the classifier's loss.
multiple_choice_loss = classification_loss


def eval_metrics(logits: np.ndarray, label_ids: np.ndarray) -> Dict[str, float]:
    """logits float [N, C], label_ids int [N] -> eval_accuracy and eval_loss (mean cross-entropy)."""
    return {"eval_accuracy": float(np.mean(logits.argmax(-1) == label_ids)), "eval_loss": mean_xent(logits, label_ids)}


class SwagTask(FinetuneTask):
    """Four endings scored by one vector on each pooled output; logits [N, C]."""

    task_type = "multiple_choice"
    eval_splits = (EVAL_SPLIT,)
    predict_splits = ("test",)
    loss = staticmethod(multiple_choice_loss)

    def __init__(self, cfg: SwagRunConfig):
        self.cfg = cfg

    def setup(self, pretrained):
        return TaskRecord(self.task_type, task="swag", num_choices=swag.NUM_CHOICES)

    def featurize(self, split, tokenizer):
        """examples and arrays [N, C, S] + label_ids [N]; train/dev must carry labels."""
        path = os.path.join(self.cfg.data_dir, SPLIT_FILES[split])
        examples = swag.read_swag_examples(path, has_labels=True if split != "test" else None)
        if not examples:
            raise InputDataError(f"{path}: no examples (expected SWAG rows after the header)")
        features = swag.convert_examples_to_features(examples, self.cfg.max_seq_length, tokenizer)
        return Featurized(examples, swag.features_to_arrays(features, self.cfg.max_seq_length), len(examples))

    def score(self, split, data, logits):
        return (eval_metrics(logits, data.arrays["label_ids"]) if split == EVAL_SPLIT else None), logits

    def write(self, output_dir, split, data, logits):
        if split == "test":
            write_text_atomic(os.path.join(output_dir, PREDICTIONS_FILE),
                              swag.predictions_text(data.examples, softmax(logits)))
            logger.info("wrote %s (%d examples)", PREDICTIONS_FILE, len(data.examples))

    def summary(self):
        return {"task": f"SWAG ({swag.NUM_CHOICES} choices)"}


def run(cfg: SwagRunConfig) -> Dict[str, Dict[str, float]]:
    """Trains / evaluates / predicts as asked; returns {"dev": eval results} when evaluated."""
    return run_finetuning(SwagTask(cfg), cfg)


__all__ = ["SwagRunConfig", "SwagTask", "eval_metrics", "multiple_choice_loss", "run"]
