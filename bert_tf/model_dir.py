"""The model directory: the one owner of what a run leaves in its output_dir and of turning it back into a model.

A model directory (written by pretraining and by every fine-tuning runner, read by
fine-tuning, the export, predict.py and convert_checkpoint.py) holds:
  bert_config.json     the encoder's BertConfig
  vocab.txt            the word pieces the model was trained with
  bert_tf_info.json    the run info: do_lower_case, max_seq_length, task_type and the task's
                       own facts (label_list, num_choices, causal_attention, objective, ...)
  checkpoint, ckpt-<step>.*   tf.train.Checkpoint(model=<task model>, ...) saves
  best/                the fine-tuning runners' best model by the dev metric, itself a model directory
TASK_MODELS is the one map from a task_type to the model it names (docs/design.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from typing import Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from bert_tf.configs import (
    RUN_INFO_FILE,
    TASK_TYPES,
    BertConfig,
    TaskRecord,
    read_run_info,
    write_run_info,
)
from bert_tf.errors import CheckpointError, ConfigError
from bert_tf.fileio import write_text_atomic
from bert_tf.models import (
    BertClassifier,
    BertEncoder,
    BertMultipleChoice,
    BertPretrainer,
    BertSpanLabeler,
    BertTokenClassifier,
)
from bert_tf.models.feature_tagger import BiLSTMFeatureTagger
from bert_tf.models.layer_combination import parse_layer_combination

logger = logging.getLogger("bert_tf.model_dir")

CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
SIDE_FILES = (CONFIG_FILE, VOCAB_FILE, RUN_INFO_FILE)
CHECKPOINT_NAME = "ckpt"  # tf.train.CheckpointManager's default: <model_dir>/ckpt-<step>
BEST_DIR = "best"
# TensorBoard runs of a model dir: training and evaluation summaries.
TRAIN_DIR, EVAL_DIR = "train", "eval"


ModelDirError = CheckpointError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


def config_path(model_dir: str) -> str:
    return os.path.join(model_dir, CONFIG_FILE)


def vocab_path(model_dir: str) -> str:
    return os.path.join(model_dir, VOCAB_FILE)


# ------------------------------------------------------------------ checkpoints
def checkpoint_prefix(model_dir: str, step: int) -> str:
    return os.path.join(model_dir, f"{CHECKPOINT_NAME}-{step}")


def checkpoint_step(path: str) -> Optional[int]:
    """The step of a `.../ckpt-<step>` prefix, or None for another name."""
    m = re.fullmatch(rf"{CHECKPOINT_NAME}-(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else None


def checkpoint_candidates(model_dir: str) -> List[str]:
    """Checkpoint prefixes of model_dir, newest step first: the steps the state file lists and any
    `ckpt-<step>.index` beside them (a save whose state update was cut off).

    Every prefix is built here as `<model_dir>/ckpt-<step>`, the one place a checkpoint path is made:
    TensorFlow returns the state file's entries already joined with the directory it was given
    (relative when that was relative), or absolute where the folder was written before a move; only
    the step is taken from them, so `name`, `./name`, `name/`, `../x/name`, a symlink, an absolute
    path and `gs://bucket/name` all give prefixes that open from the current directory."""
    paths = []
    with contextlib.suppress(tf.errors.OpError):  # an unreadable state file: the .index files still count
        state = tf.train.get_checkpoint_state(model_dir)
        paths += list(state.all_model_checkpoint_paths) if state else []
    paths += tf.io.gfile.glob(os.path.join(model_dir, f"{CHECKPOINT_NAME}-*.index"))
    steps = {checkpoint_step(p[: -len(".index")] if p.endswith(".index") else p) for p in paths}
    return [checkpoint_prefix(model_dir, step) for step in sorted(steps - {None}, reverse=True)]


def latest_checkpoint(model_dir: str) -> Optional[str]:
    """The newest `ckpt-<step>` prefix of model_dir whose index file exists, or None."""
    for path in checkpoint_candidates(model_dir) if tf.io.gfile.isdir(model_dir) else []:
        if tf.io.gfile.exists(path + ".index"):
            return path
    return None


def has_checkpoint(model_dir: str) -> bool:
    return latest_checkpoint(model_dir) is not None


def remove_partial_saves(model_dir: str) -> List[str]:
    """Deletes the `ckpt-<step>_temp*` folders that a save killed midway leaves (tf.train.Checkpoint
    writes there, then renames); a complete checkpoint is never touched. Returns what was removed."""
    removed = []
    for path in tf.io.gfile.glob(os.path.join(model_dir, f"{CHECKPOINT_NAME}-*_temp*")):
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)
        removed.append(path)
    return removed


# What a failed restore was, for its message: only a mismatch means "another model".
RESTORE_MISSING, RESTORE_CORRUPT, RESTORE_MISMATCH = "missing files", "unreadable or corrupt data", "does not match the model"
_INCOMPATIBLE = re.compile(r"incompatible tensor with shape (\([^)]*\)) when attempting to restore variable with "
                           r"shape (\([^)]*\)) and name (\S+?)(?::\d+)?\.?$")
_UNBOUND = re.compile(r"<Variable path=([^,]+), shape=(\([^)]*\))")


def describe_restore_error(error: BaseException) -> Tuple[str, str]:
    """(kind, one-line detail) of an exception raised restoring a checkpoint: RESTORE_MISSING (files not
    there), RESTORE_CORRUPT (there but unreadable: truncated, bad checksum, not a checkpoint) or
    RESTORE_MISMATCH (read fine, but a variable's shape differs or the model has a variable the
    checkpoint lacks: the first such variable is named with both shapes)."""
    text = " ".join(str(error).split())
    if isinstance(error, ValueError) and (m := _INCOMPATIBLE.search(text)):
        return RESTORE_MISMATCH, f"{m.group(3)} has shape {m.group(1)} in the checkpoint, {m.group(2)} in the model"
    if isinstance(error, AssertionError):
        m = _UNBOUND.search(text)
        what = f"{m.group(1)} {m.group(2)}" if m else text[:200]
        return RESTORE_MISMATCH, f"the model's {what} has no value in the checkpoint"
    if (isinstance(error, tf.errors.NotFoundError) or "Failed to find any matching files" in text
            or "No such file or directory" in text):
        return RESTORE_MISSING, "its files are not there"
    if isinstance(error, (tf.errors.OpError, IndexError)):
        detail = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text)
        return RESTORE_CORRUPT, re.sub(r"\s*\[Op:\w+\].*$", "", detail)[:200]
    return RESTORE_MISMATCH, text[:200]


# ------------------------------------------------------------------ side files
def read_config(model_dir: str) -> Optional[BertConfig]:
    """The bert_config.json of model_dir, or None when there is none."""
    path = config_path(model_dir)
    return BertConfig.from_json_file(path) if tf.io.gfile.exists(path) else None


def config_changes(model_dir: str, config: BertConfig) -> List[str]:
    """The keys in which model_dir's bert_config.json differs from `config` (empty: none, or no file)."""
    existing = read_config(model_dir)
    if existing is None or existing == config:
        return []
    return [k for k, v in existing.to_dict().items() if config.to_dict()[k] != v]


def write_config(model_dir: str, config: BertConfig) -> None:
    config.to_json_file(config_path(model_dir))


def copy_vocab(vocab_file: str, model_dir: str) -> None:
    """vocab.txt into model_dir (written atomically; nothing to do when it is already that file)."""
    out = vocab_path(model_dir)
    if os.path.abspath(vocab_file) != os.path.abspath(out):
        with tf.io.gfile.GFile(vocab_file, "r") as f:
            write_text_atomic(out, f.read())


def check_config(model_dir: str, config: BertConfig) -> None:
    """Refuses a model_dir whose checkpoints were trained with another bert_config (reads only)."""
    # (the state file is enough: a run's checkpoints are or were there)
    changed = config_changes(model_dir, config) if tf.train.get_checkpoint_state(model_dir) is not None else []
    if changed:
        raise CheckpointError(
            f"{model_dir}: holds the checkpoints of a run with a different bert_config ({', '.join(changed)}); "
            "use a new --output_dir or pass --overwrite_output_dir")


def write_finetuned(model_dir: str, config: BertConfig, vocab_file: str, record: TaskRecord, *,
                    do_lower_case: bool, max_seq_length: int) -> None:
    """The side files of a fine-tuned model; refuses a model_dir whose checkpoints have another bert_config.
    A causal record makes the export and later fine-tuning rebuild the causal encoder."""
    check_config(model_dir, config)
    tf.io.gfile.makedirs(model_dir)
    write_config(model_dir, config)
    copy_vocab(vocab_file, model_dir)
    write_run_info(model_dir, do_lower_case=do_lower_case, max_seq_length=int(max_seq_length), **record.to_info())


def copy_side_files(source_dir: str, target_dir: str) -> None:
    """bert_config.json, vocab.txt and bert_tf_info.json of source_dir into target_dir (e.g. best/)."""
    for name in SIDE_FILES:
        tf.io.gfile.copy(os.path.join(source_dir, name), os.path.join(target_dir, name), overwrite=True)


def check_matches(model_dir: str, record: TaskRecord, config: Optional[BertConfig] = None) -> None:
    """Refuses to resume into a model_dir that holds a different task's checkpoints (TaskRecord.MATCHED),
    or (given `config`) checkpoints of another bert_config (check_config). Reads only."""
    if config is not None:
        check_config(model_dir, config)
    info = read_run_info(model_dir)
    if not info or not has_checkpoint(model_dir):
        return
    expected = record.to_info()
    for key in TaskRecord.MATCHED:
        value = expected.get(key)
        if key in info and value is not None and info[key] != value:
            raise CheckpointError(f"{model_dir}: holds a run with {key}={info[key]!r}, not {value!r}; use a new --output_dir")


def read(model_dir: str) -> Tuple[BertConfig, dict]:
    """(BertConfig, run info) of a model_dir, with one-line errors for missing pieces."""
    if not tf.io.gfile.isdir(model_dir):
        raise CheckpointError(f"{model_dir}: model_dir not found")
    config_file = config_path(model_dir)
    if not tf.io.gfile.exists(config_file):
        raise CheckpointError(f"{config_file}: not found (a model_dir needs {', '.join(SIDE_FILES)})")
    info_file = os.path.join(model_dir, RUN_INFO_FILE)
    if not tf.io.gfile.exists(info_file):
        raise CheckpointError(f"{info_file}: not found (written by the fine-tuning runners)")
    try:
        info = read_run_info(model_dir)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{info_file}: not valid JSON ({e})") from None
    for key, kind in (("do_lower_case", bool), ("max_seq_length", int)):
        if not isinstance(info.get(key), kind):
            raise CheckpointError(f"{info_file}: {key} must be a {kind.__name__}")
    return BertConfig.from_json_file(config_file), info


# ------------------------------------------------------------------ task type -> model
def _classifier(encoder, record, skip_padding):
    return BertClassifier(encoder, num_labels=len(record.label_list), skip_padding=skip_padding,
                          pooling=record.pooling or "cls")


def _regressor(encoder, record, skip_padding):
    return BertClassifier(encoder, num_labels=1, skip_padding=skip_padding, pooling=record.pooling or "cls")


def _span_labeler(encoder, record, skip_padding):
    return BertSpanLabeler(encoder)


def _multiple_choice(encoder, record, skip_padding):
    return BertMultipleChoice(encoder, num_choices=record.num_choices, skip_padding=skip_padding)


def _tagger(encoder, record, skip_padding):
    """BertTokenClassifier; feature-based: the BiLSTM on frozen features (run_ner.py --feature_based)."""
    if record.feature_based:
        layers = parse_layer_combination(record.feature_layers).fit(encoder.config.num_hidden_layers)
        return BiLSTMFeatureTagger(encoder, len(record.label_list), layers)
    return BertTokenClassifier(encoder, num_labels=len(record.label_list))


def _pretrainer(encoder, record, skip_padding):
    return BertPretrainer(encoder.config, encoder=encoder, skip_padding=skip_padding)


# task_type -> builder(encoder, TaskRecord, skip_padding) of the task model on that encoder.
# skip_padding: the models whose heads read the [CLS] or masked positions only run their dense layers
# on real tokens (bert_tf/models/encoder.py); training under XLA builds them with it off.
TASK_MODELS: Dict[str, Callable] = {
    "classification": _classifier,
    "regression": _regressor,
    "span": _span_labeler,
    "multiple_choice": _multiple_choice,
    "tagging": _tagger,
    "pretraining": _pretrainer,
}
assert tuple(TASK_MODELS) == TASK_TYPES, "a task type without its model builder (or the reverse)"


def build_task_model(config: BertConfig, info, skip_padding: bool = True):
    """The freshly initialised model that a TaskRecord (or bert_tf_info.json's dict: TaskRecord.from_info)
    names, on a new encoder of `config` (causal for a left-to-right --objective=ltr encoder)."""
    try:
        record = info if isinstance(info, TaskRecord) else TaskRecord.from_info(info)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    encoder = BertEncoder(config, causal=bool(record.causal_attention))
    return TASK_MODELS[record.task_type](encoder, record, skip_padding)


def restore(model_dir: str, checkpoint: Optional[str] = None):
    """The task model of a model_dir with the weights of its latest (or the given) checkpoint.

    Optimizer slots and the step in the checkpoint are ignored; every model variable must be found there.
    """
    config, info = read(model_dir)
    model = build_task_model(config, info)
    path = checkpoint or latest_checkpoint(model_dir)
    if path is None:
        raise CheckpointError(f"{model_dir}: no {CHECKPOINT_NAME}-<step> checkpoint found")
    try:
        status = tf.train.Checkpoint(model=model).read(path)
        status.expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, IndexError, tf.errors.OpError) as e:
        kind, detail = describe_restore_error(e)
        if kind == RESTORE_MISMATCH:
            raise CheckpointError(f"{path}: does not match the {info['task_type']} model of {CONFIG_FILE} ({detail})") from None
        raise CheckpointError(f"{path}: cannot be read, {kind} ({detail})") from None
    return model


# What makes model_dir look like (or resume as) a run: its checkpoints and state file, summaries
# (train/, eval/ and the HParams events in model_dir itself), side files but the vocab, and the
# fine-tuning runners' best model (bert_tf.model_dir).
_RUN_FILES = ("checkpoint", f"{CHECKPOINT_NAME}-*", TRAIN_DIR, EVAL_DIR, BEST_DIR,
              CONFIG_FILE, RUN_INFO_FILE, "events.out.tfevents.*")


def clear_model_dir(model_dir: str) -> list:
    """Deletes a previous run's checkpoints, summaries and side files from model_dir (what
    --overwrite_output_dir asks for); other files stay. Returns the removed paths."""
    removed = []
    for pattern in _RUN_FILES:
        for path in tf.io.gfile.glob(os.path.join(model_dir, pattern)):
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)
            removed.append(path)
    if removed:
        logger.warning("overwrite_output_dir: removed %d file(s) of a previous run from %s", len(removed), model_dir)
    return removed


def write_eval_results(path: str, results: Dict[str, float], ordered: bool = False) -> None:
    """The original's eval_results.txt: `key = value` lines, sorted (or in the dict's order), written atomically."""
    write_text_atomic(path, "".join(f"{k} = {results[k]}\n" for k in (results if ordered else sorted(results))))
