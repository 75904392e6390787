"""The one fine-tuning run: `run_finetuning(task, cfg)` walks every task through the same steps.

  1. check the request (something to do, a length the model holds), hold output_dir (no other live
     run may: bert_tf/run_holder.py; every run that writes there holds it, predict-only too) and check
     that it holds no other task's run nor another bert_config's (bert_tf.model_dir.check_matches);
  2. read and featurize every split asked for, before anything is written;
  3. build the Trainer (training/loop.py) on the task model the task's record names (model_dir.TASK_MODELS),
     starting from the pretrained weights, resuming from output_dir's checkpoints;
  4. write the model directory's side files, once the checkpoint is restored and training saves
     (a refused or crashed start leaves output_dir as it was);
  5. train (evaluating every eval_every_steps, by default every epoch with do_eval, and keeping the
     best model by the task's primary_metric in output_dir/best; with early_stopping, stopping once it
     has not improved for that many evaluations), or restore the trained model;
  6. evaluate: eval_results[_<split>].txt and the task's files; predict: the task's files.
The task (bert_tf.runners.task.FinetuneTask) says only what is its own: data, loss, scores, files.

Dimensions: N examples, C choices, L labels.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from bert_tf import model_dir, run_holder
from bert_tf.data.packing import pack_examples
from bert_tf.errors import ConfigError
from bert_tf.model_dir import EVAL_DIR, write_eval_results
from bert_tf.models.encoder import PACKED_INPUT_NAMES
from bert_tf.runners import arrays, shapes
from bert_tf.runners.settings import RunSettings
from bert_tf.runners.task import Featurized, FinetuneConfig, FinetuneTask
from bert_tf.tokenization import load_vocab
from bert_tf.training import optimizer as optimizer_lib
from bert_tf.training.auxiliary_lm import with_auxiliary_lm
from bert_tf.training.device_memory import device_name, one_line_when_out_of_memory
from bert_tf.training.loop import Trainer
from bert_tf.training.settings import TrainSettings
from bert_tf.training.strategy import is_chief

logger = logging.getLogger("bert_tf.runners")

BEST_RESULTS = "best_eval_results.txt"
# Written into output_dir/best when early stopping ends a run: a rerun on that output_dir trains no further.
EARLY_STOPPED = "early_stopped.txt"
# A head reading the mean of the last layer's tokens (--pooling=mean) learns at this many times --learning_rate
# unless --head_learning_rate says otherwise. The mean is a small feature (all-MiniLM-L6-v2: norm ~2 over 384
# units, ~0.08 per unit from window to window), so a fresh head at an encoder's rate barely moves in an epoch:
# on that model's frozen window means, a head alone trained 400 steps at 5e-5 stayed at chance
# (docs/finetuning.md has the measurements behind 100).
MEAN_POOLING_HEAD_LR_SCALE = 100.0
PACKED_INPUTS = PACKED_INPUT_NAMES + ("cls_positions",)  # what a packed task model reads


# ------------------------------------------------------------------ numpy scores
def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float [..., K] -> log probabilities over the last axis (float64)."""
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def softmax(logits: np.ndarray) -> np.ndarray:
    """float [..., K] -> probabilities over the last axis (float64)."""
    return np.exp(log_softmax(logits))


def mean_xent(logits: np.ndarray, labels: np.ndarray) -> float:
    """logits float [M, K], labels int [M] -> mean cross-entropy (0.0 for M = 0)."""
    if not len(labels):
        return 0.0
    return float(-np.mean(log_softmax(logits)[np.arange(len(labels)), labels]))


# ------------------------------------------------------------------ the run
def check_request(cfg: FinetuneConfig) -> None:
    """Something to do, sizes that can be run, and a sequence length the model can hold."""
    if not (cfg.do_train or cfg.do_eval or cfg.do_predict):
        raise ConfigError("at least one of --do_train, --do_eval or --do_predict must be set")
    for name in ("max_seq_length", "train_batch_size", "eval_batch_size", "predict_batch_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.do_train and not cfg.num_train_epochs > 0:
        raise ConfigError(f"--num_train_epochs must be > 0, got {cfg.num_train_epochs}")
    if not 0 <= cfg.warmup_proportion <= 1:
        raise ConfigError(f"--warmup_proportion must be in [0, 1], got {cfg.warmup_proportion}")
    if cfg.early_stopping < 0:
        raise ConfigError(f"--early_stopping must be >= 0 (evaluations without improvement), got {cfg.early_stopping}")
    limit = cfg.run.pretrained.config.max_position_embeddings
    if cfg.max_seq_length > limit:
        raise ConfigError(
            f"max_seq_length {cfg.max_seq_length} is longer than the model's max_position_embeddings {limit}")


def check_early_stopping(cfg: FinetuneConfig, task: FinetuneTask) -> None:
    """--early_stopping only where training evaluates: with --do_train, a scored split, and --do_eval or
    --eval_every_steps > 0."""
    if not cfg.early_stopping:
        return
    if not cfg.do_train:
        raise ConfigError("--early_stopping stops training: it needs --do_train")
    if not task.eval_splits:
        raise ConfigError("--early_stopping needs a dev set to evaluate during training; this run has none")
    if cfg.eval_every_steps == 0 or (cfg.eval_every_steps is None and not cfg.do_eval):
        raise ConfigError("--early_stopping needs evaluations during training: add --do_eval (one per epoch) "
                            "or --eval_every_steps=N")


def check_packing(task: FinetuneTask, settings: RunSettings) -> None:
    """--pack_sequences only where several examples can share a row."""
    if not settings.pack_sequences:
        return
    if task.not_packable:
        raise ConfigError(f"--pack_sequences does not apply here: {task.not_packable}")
    if settings.pretrained.causal:
        raise ConfigError("--pack_sequences needs a bidirectional model; this checkpoint is left-to-right")
    if settings.aux_lm_weight:
        raise ConfigError("--pack_sequences cannot be combined with --aux_lm_weight")
    if settings.max_sequences_per_row < 1:
        raise ConfigError(f"max_sequences_per_row must be >= 1, got {settings.max_sequences_per_row}")


def check_length_buckets(settings: RunSettings) -> int:
    """The number of static lengths batches are cut to (0: none): length_buckets without packing or
    dynamic padding, which shape batches their own way."""
    if settings.length_buckets < 0:
        raise ConfigError(f"length_buckets must be >= 0, got {settings.length_buckets}")
    return 0 if settings.pack_sequences or settings.dynamic_padding else settings.length_buckets


def pack_split(task: FinetuneTask, split: str, data: Featurized, settings: RunSettings) -> Featurized:
    """Packs a featurized split's arrays (data.packed) and logs how much of the rows is real."""
    data.packed = pack_examples(data.arrays, settings.max_sequences_per_row, task.pack_pad_values)
    mask = np.asarray(data.arrays["input_mask"])
    logger.info("%s: packed %d examples into %d rows of %d: %.1f%% of tokens real (unpacked %.1f%%)", split,
                len(mask), data.packed.num_rows, mask.shape[-1], 100 * data.packed.efficiency(),
                100 * np.count_nonzero(mask) / max(mask.size, 1))
    return data


def head_rate_for(record, train: TrainSettings) -> TrainSettings:
    """`train` with the head's rate a run of `record` uses: --head_learning_rate when given, else
    MEAN_POOLING_HEAD_LR_SCALE x the learning rate for a head on the mean of the tokens (record.pooling "mean"),
    else the learning rate (None: the original's one rate)."""
    if record.pooling != "mean" or train.head_learning_rate is not None:
        return train
    return dataclasses.replace(train, head_learning_rate=MEAN_POOLING_HEAD_LR_SCALE * train.learning_rate)


def make_trainer(settings: RunSettings, output_dir: str, model_fn: Callable, loss_fn: Callable, *,
                 num_train_steps: int, global_batch_size: int, warmup_proportion: float) -> Trainer:
    """A Trainer whose fresh model starts from `settings.pretrained` (a resumed run from output_dir).

    With `settings.aux_lm_weight` > 0 the model gets an LM head and the loss the auxiliary LM term.
    """
    if settings.aux_lm_weight < 0:
        raise ValueError(f"aux_lm_weight must be >= 0, got {settings.aux_lm_weight}")
    if settings.aux_lm_weight > 0:
        model_fn, loss_fn = with_auxiliary_lm(model_fn, loss_fn, settings.aux_lm_weight,
                                              causal=settings.pretrained.causal,
                                              vocab=load_vocab(settings.pretrained.vocab_file))
    steps = max(num_train_steps, 1)
    return Trainer(settings.strategy, settings.train, model_fn, loss_fn,
                   optimizer_lib.optimizer_fn(settings.train, steps, int(steps * warmup_proportion)),
                   init_fn=settings.pretrained.init_fn, model_dir=output_dir, train_steps=steps,
                   global_batch_size=global_batch_size)


def run_finetuning(task: FinetuneTask, cfg: FinetuneConfig) -> Dict[str, Dict[str, float]]:
    """Trains / evaluates / predicts as `cfg` asks; returns {split: results} of what was scored."""
    # 1. the request, and output_dir holds no other run
    if cfg.run is None:
        raise ConfigError(f"{type(cfg).__name__}.run (the RunSettings) is required to run")
    check_request(cfg)
    with run_holder.holding(cfg.output_dir, chief=is_chief(cfg.run.strategy)):  # raises OutputDirHeld (one line)
        return _run_held(task, cfg)


def _run_held(task: FinetuneTask, cfg: FinetuneConfig) -> Dict[str, Dict[str, float]]:
    """run_finetuning's steps once this run holds output_dir (bert_tf/run_holder.py)."""
    settings, out = cfg.run, cfg.output_dir
    pretrained = settings.pretrained
    record = dataclasses.replace(task.setup(pretrained), causal_attention=pretrained.causal)
    model_dir.check_matches(out, record, pretrained.config)
    check_early_stopping(cfg, task)
    settings = dataclasses.replace(settings, train=head_rate_for(record, settings.train))
    tokenizer = pretrained.tokenizer(cfg.do_lower_case)

    check_packing(task, settings)
    pack, jit = settings.pack_sequences, settings.train.jit_compile
    dynamic_padding = settings.dynamic_padding and not pack
    buckets = check_length_buckets(settings)
    lengths: Dict[str, Tuple[int, ...]] = {}  # split -> the lengths its batches are cut to (buckets)

    def featurize(split):
        data = task.featurize(split, tokenizer)
        if buckets:
            own = shapes.example_lengths(data.arrays["input_mask"])
            lengths[split] = shapes.choose_lengths(own, cfg.max_seq_length, buckets)
            batch = cfg.train_batch_size if split == "train" else (
                cfg.eval_batch_size if split in task.eval_splits else cfg.predict_batch_size)
            logger.info(shapes.describe(split, own, lengths[split], batch, cfg.max_seq_length))
        return pack_split(task, split, data, settings) if pack else data

    # 2. every input is read and featurized before anything is written to output_dir
    train = featurize("train") if cfg.do_train else None
    # An epoch is one pass over the examples; packed, a batch is train_batch_size rows.
    train_units = (train.packed.num_rows if pack else train.count) if train else 0
    num_train_steps = max(1, int(train_units / cfg.train_batch_size * cfg.num_train_epochs)) if train else 0
    eval_every = eval_interval(cfg, task, train_units)
    evals = {s: featurize(s) for s in task.eval_splits} if cfg.do_eval or eval_every else {}
    predicts = {s: evals.get(s) or featurize(s) for s in task.predict_splits} if cfg.do_predict else {}

    # 3. the Trainer on the task model, from the pretrained weights or output_dir's checkpoint
    def model_fn():
        model = pretrained.build_model(record, skip_padding=not jit)
        if train is not None:
            task.start_head(model, train)
        return model

    trainer = make_trainer(settings, out, model_fn, task.loss, num_train_steps=num_train_steps,
                           global_batch_size=cfg.train_batch_size, warmup_proportion=cfg.warmup_proportion)

    # 4. the side files, written once the run has restored (or refused) output_dir's checkpoint and trains
    def write_side_files():  # once the run has restored (or refused) output_dir's checkpoint and trains
        model_dir.write_finetuned(out, pretrained.config, pretrained.vocab_file, record,
                                  do_lower_case=cfg.do_lower_case, max_seq_length=cfg.max_seq_length)

    scoring = set(task.eval_splits) & (set(evals) | set(predicts))  # the splits with metrics
    boards = {split: eval_writer(out, split, len(scoring), trainer.is_chief) for split in scoring}
    scored: Dict[str, Tuple] = {}  # split -> (step, metrics, decoded) of the latest prediction
    replicas = settings.strategy.num_replicas_in_sync

    def out_of_memory(phase: str, global_batch: int):  # one line when a batch does not fit (training/device_memory.py)
        per_replica = global_batch // (replicas * (settings.train.gradient_accumulation_steps if phase == "training"
                                                   else 1))
        return one_line_when_out_of_memory(phase, batch_per_replica=per_replica, seq_length=cfg.max_seq_length,
                                           precision=settings.train.mixed_precision,
                                           device=device_name(settings.strategy), unit="rows" if pack else "examples")
    predictor = arrays.Predictor(trainer.model, sequence_outputs=task.sequence_outputs,
                                 dynamic_padding=dynamic_padding, jit_compile=jit, strategy=settings.strategy,
                                 length_buckets=buckets)

    def score(split: str, data, batch_size: int):
        step = int(trainer.global_step.numpy())
        if split not in scored or scored[split][0] != step:
            with out_of_memory("prediction", batch_size):
                if pack:
                    outputs = data.packed.unpack(predictor(data.packed.arrays, batch_size, PACKED_INPUTS),
                                                 sequence_outputs=task.sequence_outputs)
                else:
                    outputs = predictor(data.arrays, batch_size)
            metrics, decoded = task.score(split, data, outputs)
            if metrics is not None:
                metrics["global_step"] = step
                logger.info("%s at step %d: %s", split, step, " ".join(
                    f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()
                    if k != "global_step"))
                if split in scoring:  # TensorBoard: dev metrics on the training curves' charts
                    write_eval_summaries(boards[split], step, metrics)
            scored[split] = (step, metrics, decoded)
        return scored[split][1:]

    def evaluate() -> Dict[str, Dict[str, float]]:
        return {split: score(split, data, cfg.eval_batch_size)[0] for split, data in evals.items()}

    def write_results(split: str, metrics: Dict[str, float]) -> None:
        if split in task.eval_splits:
            name = "eval_results.txt" if len(task.eval_splits) == 1 else f"eval_results_{split}.txt"
        else:
            name = f"{split}_results.txt"
        write_eval_results(os.path.join(out, name), metrics, ordered=task.ordered_results)
        logger.info("wrote %s in %s", name, out)

    # 5. train (evaluating every eval_every steps, keeping the best model), or restore the trained model
    results: Dict[str, Dict[str, float]] = {}
    if cfg.do_train:
        extra = dict(task.summary())
        if pack:
            extra["packing"] = (f"{train.count} examples in {train_units} rows, {train.packed.efficiency():.1%} of "
                                f"tokens real; batches and epochs count rows")
        elif jit:  # what XLA computes: every position of every batch
            extra["batch shapes"] = batch_shapes_summary(train, lengths.get("train"), cfg)
        if eval_every:
            extra["best model"] = best_model_summary(task, eval_every, cfg.early_stopping)
        trainer.run_summary(train_units, int(num_train_steps * cfg.warmup_proportion), extra=extra,
                            unit="rows" if pack else "examples")
        trainer.write_hparams(dict(task=task.task_type, max_seq_length=cfg.max_seq_length,
                                   num_train_epochs=cfg.num_train_epochs, warmup_proportion=cfg.warmup_proportion,
                                   pack_sequences=pack, dynamic_padding=dynamic_padding, length_buckets=buckets,
                                   aux_lm_weight=settings.aux_lm_weight, eval_every_steps=eval_every))
        dataset_fn, input_id = arrays.training_input(train.packed.arrays if pack else train.arrays,
                                                     seed=settings.train.seed, dynamic_padding=dynamic_padding,
                                                     lengths=lengths.get("train"),
                                                     micro_batches=settings.train.num_micro_batches)
        with out_of_memory("training", cfg.train_batch_size):
            results = train_with_periodic_eval(
                trainer, dataset_fn, num_train_steps, eval_every, evaluate,
                metric=(task.eval_splits[0] if eval_every else "", task.primary_metric), output_dir=out,
                ordered=task.ordered_results, input_id=input_id,
                before_first_save=write_side_files if trainer.is_chief else None, patience=cfg.early_stopping)
    else:
        if trainer.restore() is None and not pretrained.init_checkpoint:
            logger.warning("no checkpoint in %s and no --init_checkpoint: using an untrained model", out)
        if trainer.is_chief:
            write_side_files()
    # 6. evaluate and predict: eval_results[_<split>].txt and the task's files
    if cfg.do_eval:
        results = evaluate()  # an evaluation at the last training step is not run again
        for split, data in evals.items():
            write_results(split, results[split])
            task.write(out, split, data, scored[split][2])
    for split, data in predicts.items():
        if cfg.do_eval and split in evals:
            continue  # written with the evaluation
        metrics, decoded = score(split, data, cfg.predict_batch_size)
        task.write(out, split, data, decoded)
        if metrics is not None:
            results[split] = metrics
            write_results(split, metrics)
    if jit:  # the compile-count bound of docs/design.md: one program per shape
        logger.info("XLA programs traced: training step %d, prediction %d",
                    trainer.train_step_traces, predictor.traces)
        logger.info("XLA compiling: %s; prediction %.1f s (the calls that compiled its %d programs)",
                    shapes.training_compile_text(trainer.loop_history, len(lengths.get("train", ())) or 1),
                    predictor.compile_seconds, predictor.traces)
    return results


def batch_shapes_summary(train: Featurized, chosen: Optional[Tuple[int, ...]], cfg: FinetuneConfig) -> str:
    """The run summary's line on the training batches' shapes under XLA and their real-token share."""
    own = shapes.example_lengths(train.arrays["input_mask"])
    padded = own.sum() / max(len(own) * cfg.max_seq_length, 1)
    if not chosen:
        return f"[{cfg.train_batch_size}, {cfg.max_seq_length}] for every batch: {padded:.1%} of positions real"
    return (f"[{cfg.train_batch_size}, n] for n in {', '.join(map(str, chosen))} (one compiled program each): "
            f"{shapes.real_share(own, chosen):.1%} of positions real (padded to {cfg.max_seq_length}: {padded:.1%})")


def best_model_summary(task: FinetuneTask, eval_every: int, patience: int) -> str:
    """The run summary's line on what picks output_dir/best and when early stopping ends the run."""
    text = (f"{model_dir.BEST_DIR}/ keeps the highest {task.primary_metric} on {task.eval_splits[0]}, "
            f"evaluated every {eval_every} steps")
    if patience:
        text += f"; early stopping after {patience} evaluation(s) without a higher one"
    return text


def eval_interval(cfg: FinetuneConfig, task: FinetuneTask, train_units: int) -> int:
    """Steps between evaluations during training (0: none): --eval_every_steps, or by default with
    do_train and do_eval one epoch's steps (whole batches), so the eval run draws a curve."""
    if not (cfg.do_train and task.eval_splits):
        return 0
    if cfg.eval_every_steps is not None:
        return cfg.eval_every_steps
    return max(1, train_units // cfg.train_batch_size) if cfg.do_eval else 0


def summary_tag(key: str) -> str:
    """The TensorBoard tag of an eval_results.txt key: without its "eval_" prefix, so an eval metric
    shares its chart with the training metric of the same name (eval_accuracy -> accuracy)."""
    return key[len("eval_"):] if key.startswith("eval_") else key


def eval_writer(output_dir: str, split: str, num_splits: int, is_chief: bool):
    """The summary writer of a scored split: output_dir/eval, or output_dir/eval/<split> when the task
    scores several (MNLI's matched and mismatched: one run each, the same tags)."""
    if not is_chief:
        return tf.summary.create_noop_writer()
    folder = os.path.join(output_dir, EVAL_DIR) if num_splits == 1 else os.path.join(output_dir, EVAL_DIR, split)
    return tf.summary.create_file_writer(folder)


def write_eval_summaries(writer, step: int, metrics: Dict[str, float]) -> None:
    """One point per evaluation of every numeric metric but global_step, tagged by summary_tag."""
    with writer.as_default(step=step):
        for key, value in metrics.items():
            if key != "global_step":
                tf.summary.scalar(summary_tag(key), value)
    writer.flush()


def train_with_periodic_eval(trainer: Trainer, dataset_fn: Callable, num_train_steps: int, eval_every: int,
                             evaluate: Callable[[], Dict[str, Dict[str, float]]], metric: Tuple[str, str],
                             output_dir: str, ordered: bool = False, input_id: str = "",
                             before_first_save: Optional[Callable[[], None]] = None,
                             patience: int = 0) -> Dict[str, Dict[str, float]]:
    """Trains to `num_train_steps`; every `eval_every` steps runs `evaluate` and keeps the best model.

    The best model (by `metric` = (eval split, key), higher is better) goes to
    `<output_dir>/best/` as a complete model directory (checkpoint and side files,
    bert_tf.model_dir) with `best_eval_results.txt`, so it can be exported or
    fine-tuned from like any other. `patience` > 0: training stops once that many evaluations in a row
    (counted from the best's step on a resumed run) found no higher value; best/EARLY_STOPPED records it, and
    a rerun on output_dir trains no further. Returns the last evaluation. input_id and before_first_save go
    to Trainer.train.
    """
    if not eval_every:
        trainer.train(dataset_fn, input_id=input_id, before_first_save=before_first_save)
        return {}
    best_dir = os.path.join(output_dir, model_dir.BEST_DIR)
    best = _read_results(os.path.join(best_dir, BEST_RESULTS))
    best_value = float(best[metric[1]]) if metric[1] in best else None
    best_step = int(float(best.get("global_step", 0)))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=trainer.model), best_dir, max_to_keep=1)
    results: Dict[str, Dict[str, float]] = {}
    step = int(trainer.global_step.numpy())
    marker = os.path.join(best_dir, EARLY_STOPPED)
    stopped = _read_results(marker)
    if stopped:  # a rerun after an early stop: the model of that stop, no more training
        trainer.restore()
        logger.info("%s stopped early at step %s (%s last improved at step %s): not training further "
                    "(--overwrite_output_dir starts afresh; deleting %s trains on)", output_dir,
                    stopped.get("stopped_at_step"), metric[1], stopped.get("best_step"), marker)
        return results
    stale = step // eval_every - best_step // eval_every if best_value is not None else 0  # a resumed run
    while step < num_train_steps and not (patience and stale >= patience):
        target = min(num_train_steps, (step // eval_every + 1) * eval_every)
        trainer.train_steps = target
        trainer.train(dataset_fn, input_id=input_id, before_first_save=before_first_save)
        step = int(trainer.global_step.numpy())
        results = evaluate()
        value = results[metric[0]][metric[1]]
        if best_value is None or value > best_value:
            best_value, best_step, stale = value, step, 0
            manager.save(checkpoint_number=step)
            model_dir.copy_side_files(output_dir, best_dir)
            write_eval_results(os.path.join(best_dir, BEST_RESULTS), results[metric[0]], ordered=ordered)
            logger.info("new best %s %.4f at step %d -> %s", metric[1], value, step, best_dir)
        else:
            stale += 1
    if patience and stale >= patience and step < num_train_steps:
        write_eval_results(os.path.join(best_dir, EARLY_STOPPED),
                           {"stopped_at_step": step, "best_step": best_step, "patience": patience}, ordered=True)
        logger.info("early stopping at step %d of %d: %s has not improved on %.4f (step %d) for %d evaluation(s); "
                    "the best model is %s", step, num_train_steps, metric[1], best_value, best_step, stale, best_dir)
    return results


def _read_results(path: str) -> Dict[str, str]:
    """A `key = value` file (write_eval_results) as {key: value text}; {} when there is none."""
    if not tf.io.gfile.exists(path):
        return {}
    with tf.io.gfile.GFile(path) as f:
        return dict(line.rstrip("\n").partition(" = ")[::2] for line in f if " = " in line)
