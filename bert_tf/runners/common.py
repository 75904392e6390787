"""The part of a fine-tuning run every task shares: the trainer set-up and evaluation during training.

Dimensions: none; this module wires objects together.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Dict, Optional, Tuple

import keras
import tensorflow as tf

from bert_tf.configs import RUN_INFO_FILE, write_text_atomic
from bert_tf.finetuning import Pretrained
from bert_tf.training import optimizer as optimizer_lib
from bert_tf.training.loop import TrainConfig, Trainer

logger = logging.getLogger("bert_tf.runners")

BEST_DIR = "best"
BEST_RESULTS = "best_eval_results.txt"


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How to train (shared by every runner); the task's own settings live in its run config."""

    pretrained: Pretrained
    strategy: tf.distribute.Strategy
    learning_rate: float = 5e-5
    optimizer: str = "adamw"
    weight_decay_rate: float = optimizer_lib.WEIGHT_DECAY_RATE
    clip_norm: float = optimizer_lib.CLIP_NORM
    mixed_precision: str = "float32"
    jit_compile: bool = False
    iterations_per_loop: int = 1000
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 5
    gradient_accumulation_steps: int = 1
    seed: int = 12345
    dynamic_padding: bool = True  # batch by length; off on TPU (fixed shapes)
    # > 0: add this times the pretraining LM loss on the task inputs (GPT-1's auxiliary objective,
    # lambda = 0.5 there; bert_tf.training.auxiliary_lm). 0: the plain fine-tuning loss, as BERT.
    aux_lm_weight: float = 0.0


def check_request(cfg) -> None:
    """The checks every runner makes before reading data: something to do, and a sequence length
    the model can hold. `cfg` is a runner's run config (do_* flags, max_seq_length, run settings)."""
    from bert_tf.finetuning import FinetuneError

    if not (cfg.do_train or cfg.do_eval or cfg.do_predict):
        raise FinetuneError("at least one of --do_train, --do_eval or --do_predict must be set")
    limit = cfg.run.pretrained.config.max_position_embeddings
    if cfg.max_seq_length > limit:
        raise FinetuneError(
            f"max_seq_length {cfg.max_seq_length} is longer than the model's max_position_embeddings {limit}")


def make_trainer(settings: RunSettings, output_dir: str, model_fn: Callable, loss_fn: Callable, *,
                 num_train_steps: int, global_batch_size: int, warmup_proportion: float) -> Trainer:
    """A Trainer whose fresh model starts from `settings.pretrained` (a resumed run from output_dir).

    With `settings.aux_lm_weight` > 0 the model gets an LM head and the loss the auxiliary LM term.
    """
    keras.utils.set_random_seed(settings.seed)  # head initialisation and dropout
    if settings.aux_lm_weight < 0:
        raise ValueError(f"aux_lm_weight must be >= 0, got {settings.aux_lm_weight}")
    if settings.aux_lm_weight > 0:
        from bert_tf.tokenization import load_vocab
        from bert_tf.training.auxiliary_lm import with_auxiliary_lm

        model_fn, loss_fn = with_auxiliary_lm(model_fn, loss_fn, settings.aux_lm_weight,
                                              causal=settings.pretrained.causal,
                                              vocab=load_vocab(settings.pretrained.vocab_file))
    steps = max(num_train_steps, 1)
    config = TrainConfig(
        model_dir=output_dir,
        train_steps=steps,
        global_batch_size=global_batch_size,
        steps_per_loop=settings.iterations_per_loop,
        save_checkpoints_steps=settings.save_checkpoints_steps,
        keep_checkpoint_max=settings.keep_checkpoint_max,
        clip_norm=settings.clip_norm,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        mixed_precision=settings.mixed_precision,
        jit_compile=settings.jit_compile,
    )

    def optimizer_fn(variables):
        return optimizer_lib.create_optimizer(
            settings.optimizer, variables, settings.learning_rate, steps,
            int(steps * warmup_proportion), weight_decay_rate=settings.weight_decay_rate)

    return Trainer(settings.strategy, config, model_fn, loss_fn, optimizer_fn, init_fn=settings.pretrained.init_fn)


def train_with_periodic_eval(trainer: Trainer, dataset_fn: Callable, num_train_steps: int, eval_every: int,
                             evaluate: Callable[[], Dict[str, Dict[str, float]]], metric: Tuple[str, str],
                             output_dir: str) -> Dict[str, Dict[str, float]]:
    """Trains to `num_train_steps`; every `eval_every` steps runs `evaluate` and keeps the best model.

    The best model (by `metric` = (eval split, key), higher is better) goes to
    `<output_dir>/best/` as a complete model directory (checkpoint, bert_config.json,
    vocab.txt, bert_tf_info.json) with `best_eval_results.txt`, so it can be
    exported or fine-tuned from like any other. Returns the last evaluation.
    """
    if not eval_every:
        trainer.train(dataset_fn)
        return {}
    best_dir = os.path.join(output_dir, BEST_DIR)
    best_value = _read_best(best_dir, metric[1])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=trainer.model), best_dir, max_to_keep=1)
    results: Dict[str, Dict[str, float]] = {}
    step = int(trainer.global_step.numpy())
    while step < num_train_steps:
        target = min(num_train_steps, (step // eval_every + 1) * eval_every)
        trainer.config = dataclasses.replace(trainer.config, train_steps=target)
        trainer.train(dataset_fn)
        step = int(trainer.global_step.numpy())
        results = evaluate()
        value = results[metric[0]][metric[1]]
        if best_value is None or value > best_value:
            best_value = value
            manager.save(checkpoint_number=step)
            for name in ("bert_config.json", "vocab.txt", RUN_INFO_FILE):
                tf.io.gfile.copy(os.path.join(output_dir, name), os.path.join(best_dir, name), overwrite=True)
            text = "".join(f"{k} = {v}\n" for k, v in sorted(results[metric[0]].items()))
            write_text_atomic(os.path.join(best_dir, BEST_RESULTS), text)
            logger.info("new best %s %.4f at step %d -> %s", metric[1], value, step, best_dir)
    return results


def _read_best(best_dir: str, key: str) -> Optional[float]:
    path = os.path.join(best_dir, BEST_RESULTS)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        for line in f:
            name, _, value = line.partition(" = ")
            if name == key:
                return float(value)
    return None
