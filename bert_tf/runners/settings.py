"""What every fine-tuning run starts from and how it trains (`RunSettings`): the part of a run's
config that needs TensorFlow (the strategy, the pretrained weights); the task's own settings live in
its FinetuneConfig (bert_tf.runners.task), which holds a RunSettings as `run`.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from bert_tf.data.packing import FINETUNE_MAX_SEQUENCES_PER_ROW
from bert_tf.pretrained import Pretrained
from bert_tf.training.settings import TrainSettings


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What every fine-tuning run starts from and how it trains; the task's own settings live in its run config.

    train: how to train, the same type (and flags, bert_flags.train_settings) as pretraining.
    """

    pretrained: Pretrained
    strategy: tf.distribute.Strategy
    train: TrainSettings = TrainSettings()
    dynamic_padding: bool = True  # batch by length; off on TPU and under XLA (fixed shapes)
    # > 0 without dynamic padding or packing: batches cut to one of this many lengths chosen from the
    # data (bert_tf.runners.shapes), one compiled program each under XLA; 0: every batch at max_seq_length.
    length_buckets: int = 0
    # Several examples per row of max_seq_length (bert_tf.data.packing.pack_examples): fixed shapes
    # with little padding, for XLA on TPU/GPU. Batch sizes then count rows.
    pack_sequences: bool = False
    max_sequences_per_row: int = FINETUNE_MAX_SEQUENCES_PER_ROW
    # > 0: add this times the pretraining LM loss on the task inputs (GPT-1's auxiliary objective,
    # lambda = 0.5 there; bert_tf.training.auxiliary_lm). 0: the plain fine-tuning loss, as BERT.
    aux_lm_weight: float = 0.0
