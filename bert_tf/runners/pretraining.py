"""Pretraining on TFRecords: the library call behind run_pretraining.py.

Objectives (the paper's Table 5 ablations, §5.1): "mlm_nsp" masked LM + next
sentence (BERT), "mlm" masked LM only ("No NSP"), "ltr" a left-to-right LM
with a causal attention mask on the same records ("LTR & No NSP"; see
bert_tf.models.language_model). The objective and whether the encoder is causal
are recorded in bert_tf_info.json ("objective", "causal_attention"), where
fine-tuning reads them.

`run_pretraining(config, strategy)` validates the data against the flags,
writes the model directory's side files (bert_config.json, vocab.txt,
bert_tf_info.json), trains with `bert_tf.training.loop.Trainer` (resuming from
output_dir), and evaluates into eval_results.txt in the original's format.

Two-phase training (the paper: 90% of steps at seq 128, then 10% at 512) is two
runs with the same output_dir: the second with the seq-512 data, its
--max_seq_length/--max_predictions_per_seq and the total --num_train_steps;
it resumes from the phase-1 checkpoint (weights, optimizer, step) because
the model's variables do not depend on the sequence length.

Continued pretraining (`init_checkpoint`: an original checkpoint, a Hugging Face
folder or .safetensors, or a bert_tf model dir): `resolve_init_checkpoint` takes
the config, vocab and casing from the checkpoint's folder (as fine-tuning does,
bert_tf.pretrained.resolve_pretrained) unless given; the weights load when
output_dir has no checkpoint yet (a checkpoint there is resumed instead, as the
original), the heads the checkpoint lacks start fresh (one log line names them),
and the optimizer state and step start fresh. The data's vocab must be the
checkpoint's size, or an extension of it in its [unused] slots
(bert_tf.tokenization.vocab_builder.extend_vocab), whose new tokens' embeddings
start from the mean of their old pieces' (bert_tf.pretrained.load_starting_weights).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Dict, Optional, Sequence

import tensorflow as tf

from bert_tf import fileio, model_dir, pretrained, run_holder
from bert_tf.configs import read_run_info, write_run_info
from bert_tf.data import masking, packing, pipelines, schema
from bert_tf.data.pretraining import max_predictions_needed
from bert_tf.errors import ConfigError, InputDataError
from bert_tf.models.language_model import LeftToRightPretrainer
from bert_tf.models.pretrainer import BertPretrainer
from bert_tf.runners.pretraining_config import (
    DEFAULT_MASKED_LM_PROB,
    OBJECTIVES,
    PretrainingConfig,
)
from bert_tf.tokenization import load_vocab
from bert_tf.training import loop
from bert_tf.training import optimizer as optimizer_lib
from bert_tf.training.device_memory import device_name, one_line_when_out_of_memory
from bert_tf.training.strategy import is_chief

logger = logging.getLogger("bert_tf.pretraining")

EVAL_RESULTS_FILE = "eval_results.txt"
# The keys of the original's eval_results.txt (plus global_step).
EVAL_KEYS = ("masked_lm_accuracy", "masked_lm_loss", "next_sentence_accuracy", "next_sentence_loss", "lm_accuracy",
             "lm_loss", "loss")
# Records of each input file read for its largest token id (the records do not name their vocab).
VOCAB_SCAN_RECORDS = 1000
def pretraining_loss_fn(model, batch, training):
    """BertPretrainer outputs -> (loss, metrics weighted as the original's eval metrics).

    MLM accuracy and loss are averaged over real predictions (weights =
    masked_lm_weights), NSP ones over examples, `loss` over batches; a
    left-to-right model's lm_accuracy and lm_loss over its real next-token targets.
    """
    outputs = model(batch, training=training)
    if "lm_loss" in outputs:
        count = outputs["num_predictions"]
        return outputs["loss"], {"lm_accuracy": (outputs["lm_accuracy"], count), "lm_loss": (outputs["lm_loss"], count)}
    num_predictions = tf.reduce_sum(tf.cast(batch["masked_lm_weights"], tf.float32))
    metrics = {
        "masked_lm_accuracy": (outputs["masked_lm_accuracy"], num_predictions),
        "masked_lm_loss": (outputs["masked_lm_loss"], num_predictions),
    }
    if "next_sentence_loss" in outputs:
        if "next_sentence_weights" in batch:  # packed rows: the real sequences, not the rows
            examples = tf.reduce_sum(tf.cast(batch["next_sentence_weights"], tf.float32))
        else:
            examples = tf.cast(tf.shape(batch["input_ids"])[0], tf.float32)
        metrics["next_sentence_accuracy"] = (outputs["next_sentence_accuracy"], examples)
        metrics["next_sentence_loss"] = (outputs["next_sentence_loss"], examples)
    return outputs["loss"], metrics


def _check_output_dir(config: PretrainingConfig) -> None:
    """Refuses an output_dir that holds a run of another bert_config or objective (reads only)."""
    out = config.output_dir
    if model_dir.config_changes(out, config.bert_config):
        raise ConfigError(
            f"{model_dir.config_path(out)}: output_dir holds a run with a different bert_config; use a new "
            "output_dir or pass --overwrite_output_dir"
        )
    recorded = read_run_info(out).get("objective")
    if recorded in OBJECTIVES and recorded != config.objective and model_dir.has_checkpoint(out):
        raise ConfigError(
            f"{out}: holds a run with objective {recorded}, not {config.objective}; use a new output_dir"
        )


def _write_side_files(config: PretrainingConfig) -> None:
    """bert_config.json, vocab.txt and bert_tf_info.json beside the checkpoints (fine-tuning reads them).
    Written just before the run's first checkpoint, so a start that is refused or crashes leaves an
    existing output_dir as it was (a phase-2 rerun records its seq length only once it trains)."""
    out = config.output_dir
    tf.io.gfile.makedirs(out)
    if model_dir.read_config(out) is None:
        model_dir.write_config(out, config.bert_config)
    if config.vocab_file:
        model_dir.copy_vocab(config.vocab_file, out)
    info = read_run_info(out)
    do_lower_case = config.do_lower_case if config.do_lower_case is not None else info.get("do_lower_case", True)
    write_run_info(
        out,
        do_lower_case=do_lower_case,
        use_next_sentence_prediction=config.use_next_sentence_prediction,
        max_seq_length=config.max_seq_length,
        max_predictions_per_seq=config.max_predictions_per_seq,
        objective=config.objective,
        causal_attention=config.causal,
    )


def resolve_init_checkpoint(init_checkpoint: str, bert_config_file: Optional[str] = None,
                            vocab_file: Optional[str] = None, do_lower_case: Optional[bool] = None):
    """(BertConfig, vocab file, do_lower_case, checkpoint path, whether its config asks for gradient
    checkpointing: Pretrained.gradient_checkpointing) for continuing from `init_checkpoint`.

    What is not given comes from the checkpoint's folder as for fine-tuning (bert_config.json or
    config.json, vocab.txt, the recorded casing); without a vocab anywhere the vocab file is None
    (the records hold token ids, as for the original); a --do_lower_case that contradicts the recorded
    casing is an error. Raises ConfigError (one line).
    """
    try:
        start = pretrained.resolve_pretrained(init_checkpoint, bert_config_file, vocab_file, require_vocab=False)
        if do_lower_case is not None:
            pretrained.check_lower_case(start, do_lower_case)
    except (ConfigError, InputDataError) as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    casing = do_lower_case if do_lower_case is not None else start.do_lower_case
    return start.config, start.vocab_file, casing, start.init_checkpoint, start.gradient_checkpointing


def _init_fn(config: PretrainingConfig):
    init_checkpoint = config.init_checkpoint
    if not init_checkpoint:
        return None

    def init(model):
        try:
            started = pretrained.load_starting_weights(model, init_checkpoint, None, config.vocab_file)
        except (ValueError, tf.errors.OpError) as e:
            message = str(e).strip().splitlines()[0]
            if not message.startswith(init_checkpoint):
                message = f"{init_checkpoint}: {message}"
            raise ConfigError(message) from None
        names = [f"{pretrained.PRETRAINING_HEADS[h][0]} ({pretrained.PRETRAINING_HEADS[h][1]}*)"
                 for h in started.fresh_heads]
        logger.info("initialised from %s (%s); optimizer state and step start fresh; %s", init_checkpoint,
                    started.fmt, f"heads not in the checkpoint start fresh: {', '.join(names)}" if names
                    else "every head restored")

    return init


def build_trainer(config: PretrainingConfig, strategy: tf.distribute.Strategy) -> loop.Trainer:
    """The Trainer of `config`'s run; the Trainer checks what only the run knows (TrainSettings.validate: the
    steps, the batch against the replicas) in one line."""
    settings = config.train
    init_fn = _init_fn(config)

    def model_fn():
        if config.objective == "ltr":
            return LeftToRightPretrainer(config.bert_config)
        return BertPretrainer(config.bert_config, use_next_sentence_prediction=config.use_next_sentence_prediction,
                              skip_padding=not settings.jit_compile)  # XLA: no per-batch row count

    return loop.Trainer(strategy, settings, model_fn, pretraining_loss_fn,
                        optimizer_lib.optimizer_fn(settings, config.num_train_steps, config.num_warmup_steps),
                        init_fn=init_fn, model_dir=config.output_dir,
                        train_steps=config.num_train_steps, global_batch_size=config.train_batch_size)


def _dataset_fn(config: PretrainingConfig, files, is_training: bool,
                dynamic_masking: Optional[masking.MaskingOptions] = None):
    # Training masks follow the run's seed; evaluation's are the same on every run (masking.EVAL_MASK_SEED).
    seed = config.train.seed if config.train.seed is not None else 0
    masks = dict(dynamic_masking=dynamic_masking, mask_seed=seed if is_training else masking.EVAL_MASK_SEED)

    def dataset_fn(ctx, batch_size):
        if config.pack_sequences:
            return packing.packed_pretraining_dataset(
                files, config.max_seq_length, config.max_predictions_per_seq, batch_size, is_training,
                input_context=ctx, seed=config.train.seed,
                max_sequences_per_row=config.max_sequences_per_row or packing.MAX_SEQUENCES_PER_ROW,
                skip_corrupt_records=config.skip_corrupt_records, **masks)
        return pipelines.pretraining_dataset(
            files, config.max_seq_length, config.max_predictions_per_seq, batch_size, is_training,
            input_context=ctx, seed=config.train.seed, skip_corrupt_records=config.skip_corrupt_records,
            fill_last_batch=not is_training,  # every instance evaluated, every batch one shape (XLA)
            **masks)

    return dataset_fn


@contextlib.contextmanager
def _naming_corrupt_files(files):
    """tf.data's DataLossError ("corrupted record at 1633") does not say which file: find it."""
    try:
        yield
    except tf.errors.DataLossError as e:
        corrupt = pipelines.find_corrupt_files(files)
        where = (pipelines.describe_corrupt(corrupt[0]) if corrupt
                 else f"corrupt input data in {', '.join(files)} ({str(e).strip().splitlines()[0]})")
        raise InputDataError(f"{where}; pass --skip_corrupt_records to read past it") from None


def max_token_id(path: str, limit: int = VOCAB_SCAN_RECORDS, first_ids: Optional[set] = None) -> int:
    """The largest input or masked-LM token id in the first `limit` records of a pretraining file
    (`first_ids`, when given, collects each record's first input id)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        compression = "GZIP" if f.read(2) == schema.GZIP_MAGIC else ""
    largest = 0
    for record in tf.data.TFRecordDataset(path, compression_type=compression).take(limit):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        for name in ("input_ids", "masked_lm_ids"):
            largest = max(largest, max(feature[name].int64_list.value, default=0))
        if first_ids is not None:
            first_ids.add(feature["input_ids"].int64_list.value[0])
    return largest


def _check_token_ids(config: PretrainingConfig, files) -> None:
    """Data made with a bigger vocab than the checkpoint's: one line now, not a failed gather later."""
    size = config.bert_config.vocab_size
    for path in files:
        largest = max_token_id(path)
        if largest >= size:
            raise ConfigError(
                f"{path}: token id {largest} but {config.init_checkpoint} has vocab_size {size}; the data was "
                "made with another vocab than the checkpoint's")


def run_pretraining(config: PretrainingConfig, strategy: tf.distribute.Strategy) -> Optional[Dict[str, float]]:
    """Trains and/or evaluates as `config` says, a checked config (PretrainingConfig.validate: the script
    checks it before TensorFlow loads). Returns the eval results (None without do_eval).

    Raises (bert_tf/errors.py) ConfigError / InputDataError on bad input, OutputDirHeld when another live run
    holds output_dir, TrainingError on a NaN loss, TrainingPreempted after SIGTERM; each message one line.
    """
    # 1. the data: every file's first record, before anything is written
    train_files, eval_files, (train_masks, eval_masks) = _check_inputs(config)
    # 2. output_dir held by this run alone (bert_tf/run_holder.py), and holding no other run's model
    with run_holder.holding(config.output_dir, chief=is_chief(strategy)):
        _check_output_dir(config)
        # 3. the Trainer: a fresh model from init_checkpoint, or output_dir's checkpoint resumed
        trainer = build_trainer(config, strategy)
        # 4. train; the side files are written once the run has restored or started and saves
        if config.do_train:
            _train(config, trainer, train_files, train_masks)
        # 5. evaluate into eval_results.txt
        return _evaluate(config, trainer, eval_files, eval_masks) if config.do_eval else None


def _check_inputs(config: PretrainingConfig):
    """(training files, evaluation files, their masking options) after checking that each holds records
    of config's lengths (and, with init_checkpoint, token ids the checkpoint's vocab holds); the masking
    options are None for records with masks (_masking_options)."""
    train_files = list(config.input_files)
    if not train_files:
        raise ConfigError("input_file matched no files")
    eval_files = list(config.eval_input_files or train_files)
    all_files = sorted(set(train_files) | set(eval_files))
    unreadable = set()
    if config.skip_corrupt_records:
        corrupt = pipelines.find_corrupt_files(all_files)
        unreadable = {scan.path for scan in corrupt if scan.records == 0}
        if corrupt:
            lost = sum(scan.skipped for scan in corrupt if scan.skipped > 0)
            logger.warning(
                "skip_corrupt_records: corrupt data in %d of %d file(s); reading a file stops there, so %d "
                "intact record(s) after it%s are skipped too: %s", len(corrupt), len(all_files),
                lost, " (and the rest of files whose framing is lost)" if any(s.skipped < 0 for s in corrupt) else "",
                "; ".join(pipelines.describe_corrupt(scan) for scan in corrupt))
    # Every file's first record: a shard made with other lengths fails here, not hours into training.
    kinds = {path: pipelines.check_record_lengths(path, config.max_seq_length, config.max_predictions_per_seq)
             for path in all_files if path not in unreadable}
    masks = _masking_options(config, [(train_files, "input_file"), (eval_files, "eval_input_file")], kinds)
    if config.init_checkpoint:
        _check_token_ids(config, [p for p in all_files if p not in unreadable])
        if model_dir.has_checkpoint(config.output_dir):
            logger.info("%s holds a checkpoint: resuming from it; init_checkpoint %s is not used",
                        config.output_dir, config.init_checkpoint)
    return train_files, eval_files, masks


def _masking_options(config: PretrainingConfig, file_sets, kinds):
    """[MaskingOptions or None] per (files, flag) of file_sets: None when the records hold masks.

    One line before training when a set mixes both kinds, when the kind is not config.masking, when
    masking settings are given for records that hold masks, or when records without masks have no
    vocab or another vocab than theirs (an id past its end, a first token that is not its [CLS])."""
    dynamic = sorted(p for p, kind in kinds.items() if kind == schema.DYNAMIC)
    for files, flag in file_sets:
        found = {kinds[p] for p in files if p in kinds}
        if len(found) > 1:
            static = next(p for p in files if kinds.get(p) == schema.STATIC)
            raise ConfigError(
                f"{flag}: mixes records with masks ({static}) and without ({next(p for p in files if p in dynamic)}, "
                "create_pretraining_data.py --masking=dynamic); use records of one kind")
        if found and config.masking != "auto" and found != {config.masking}:
            kind = found.pop()
            raise ConfigError(
                f"{files[0]}: records {'without' if kind == schema.DYNAMIC else 'with'} masks "
                f"(create_pretraining_data.py --masking={kind}), but masking={config.masking} was asked")
    if not dynamic:
        if config.do_whole_word_mask or config.masked_lm_prob != DEFAULT_MASKED_LM_PROB:
            raise ConfigError(
                "do_whole_word_mask and masked_lm_prob apply to records without masks; these records hold theirs "
                f"({next(iter(kinds), 'input_file')}): set them in create_pretraining_data.py")
        return [None for _ in file_sets]
    if not config.vocab_file:
        raise ConfigError(f"{dynamic[0]}: records without masks need vocab_file (the [MASK] id, the special "
                               "tokens and the ## pieces come from it)")
    needed = max_predictions_needed(config.max_seq_length, config.masked_lm_prob)
    if config.max_predictions_per_seq < needed:
        raise ConfigError(
            f"max_predictions_per_seq {config.max_predictions_per_seq} is too small for max_seq_length "
            f"{config.max_seq_length} * masked_lm_prob {config.masked_lm_prob}; set it to at least {needed}")
    try:
        vocab = load_vocab(config.vocab_file)
        options = masking.options_from_vocab(vocab, config.max_predictions_per_seq, config.masked_lm_prob,
                                             config.do_whole_word_mask, config.vocab_file)
    except InputDataError as e:
        raise ConfigError(str(e)) from None
    for path in dynamic:
        first_ids: set = set()
        largest = max_token_id(path, first_ids=first_ids)
        if largest >= options.vocab_size:
            raise ConfigError(f"{path}: token id {largest} but {config.vocab_file} has {options.vocab_size} "
                                   "tokens; the records were made with another vocab")
        if first_ids != {options.cls_id}:
            raise ConfigError(f"{path}: records start with token id(s) {sorted(first_ids)[:3]}, but "
                                   f"[CLS] is {options.cls_id} in {config.vocab_file}; the records were made "
                                   "with another vocab")
    return [options if any(kinds.get(p) == schema.DYNAMIC for p in files) else None for files, _ in file_sets]


def _describe_masking(options: Optional[masking.MaskingOptions]) -> str:
    if options is None:
        return "static (in the records)"
    return (f"dynamic, {options.masked_lm_prob:g} of the tokens up to {options.max_predictions_per_seq}, "
            f"{'whole words' if options.do_whole_word_mask else 'word pieces'}, drawn per batch read")


def _train(config: PretrainingConfig, trainer: loop.Trainer, train_files: Sequence[str],
           dynamic_masking: Optional[masking.MaskingOptions] = None) -> None:
    trainer.run_summary(
        num_warmup_steps=config.num_warmup_steps,
        extra={
            "input": f"{len(train_files)} file(s), seq {config.max_seq_length}, "
                     f"{config.max_predictions_per_seq} predictions per sequence",
            "objective": f"{config.objective}: {OBJECTIVES[config.objective][0]}",
            "masking": _describe_masking(dynamic_masking),
        },
    )
    trainer.write_hparams(dict(objective=config.objective, max_seq_length=config.max_seq_length,
                               max_predictions_per_seq=config.max_predictions_per_seq,
                               num_warmup_steps=config.num_warmup_steps, pack_sequences=config.pack_sequences))
    write_side_files = (lambda: _write_side_files(config)) if trainer.is_chief else None
    with _naming_corrupt_files(train_files), _out_of_memory(config, trainer, "training"):
        # One spelling per file: the saved input position names its files, and a rerun may spell the
        # same file another way (../data/x from another directory).
        files = [fileio.canonical_path(p) for p in train_files]
        trainer.train(_dataset_fn(config, files, is_training=True, dynamic_masking=dynamic_masking),
                      input_id=",".join(files),
                      before_first_save=write_side_files)


def _out_of_memory(config: PretrainingConfig, trainer: loop.Trainer, phase: str):
    """One line naming the flags when a batch does not fit (device_memory.one_line_when_out_of_memory)."""
    replicas = trainer.strategy.num_replicas_in_sync
    if phase == "training":
        batch = config.train_batch_size // (replicas * config.train.gradient_accumulation_steps)
    else:
        batch = config.eval_batch_size // replicas
    return one_line_when_out_of_memory(phase, batch_per_replica=max(batch, 1), seq_length=config.max_seq_length,
                                       precision=config.train.mixed_precision, device=device_name(trainer.strategy),
                                       unit="rows" if config.pack_sequences else "sequences")


def _evaluate(config: PretrainingConfig, trainer: loop.Trainer, eval_files: Sequence[str],
              dynamic_masking: Optional[masking.MaskingOptions] = None) -> Dict[str, float]:
    if not config.do_train:
        if trainer.restore() is None and not config.init_checkpoint:
            raise ConfigError(f"{config.output_dir}: no checkpoint to evaluate (and no init_checkpoint)")
    with _naming_corrupt_files(eval_files), _out_of_memory(config, trainer, "evaluation"):
        results = trainer.evaluate(_dataset_fn(config, eval_files, is_training=False, dynamic_masking=dynamic_masking),
                                   config.eval_batch_size,
                                   steps=config.max_eval_steps)
    results = {k: results[k] for k in (*EVAL_KEYS, "global_step") if k in results}
    if trainer.is_chief:
        model_dir.write_eval_results(os.path.join(config.output_dir, EVAL_RESULTS_FILE), results)
    return results
