"""Checkpoint interop: original TF1 checkpoints and Hugging Face BERT weights <-> our Keras model.

One name map (`tf1_variable_map`, bert_tf.checkpoint_names) ties every variable of
our models to its original TF1 name (as the original's modeling.py and heads create
them). Hugging Face names are derived from the TF1 names (`hf_name`), so there is
nothing else to keep in sync.

Formats:
  tf1  - `bert_model.ckpt` style: `<prefix>.index` + `<prefix>.data-*`, original names,
         float32, dense kernels [in, out]; Adam slots and `global_step` are skipped.
  hf   - `model.safetensors` (a file, or a folder that holds it and `config.json`);
         Linear weights are [out, in]. Read, and written by `write_hf_checkpoint`
         (config.json "gelu" is the erf GELU there: hidden_act "gelu_exact" here).
  ours - a TF2 object-based checkpoint, `tf.train.Checkpoint(model=model)`
         (CHECKPOINT_MODEL_KEY), as written by the training loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import Any, Dict, Mapping, Optional

import numpy as np
import tensorflow as tf

from bert_tf import model_dir
from bert_tf.checkpoint_names import _HF_SPECIAL, encoder_of, hf_name, tf1_variable_map
from bert_tf.configs import BertConfig, expected_casing, read_run_info
from bert_tf.errors import CheckpointError, ConfigError
from bert_tf.fileio import write_text_atomic
from bert_tf.models import heads
from bert_tf.models.encoder import BertEncoder
from bert_tf.models.pretrainer import BertPretrainer
from bert_tf.models.task_models import BertClassifier, BertSpanLabeler

logger = logging.getLogger(__name__)

# Our own checkpoints hold the model under this key: tf.train.Checkpoint(model=model).
CHECKPOINT_MODEL_KEY = "model"
# Variables in original checkpoints that are not model weights.
_OPTIMIZER_SUFFIXES = ("/adam_m", "/adam_v")
_NON_MODEL_NAMES = frozenset({"global_step"})


@dataclasses.dataclass
class LoadReport:
    """What a load did: names (original TF1 spelling) that were copied, not found, or not used."""

    loaded: list
    missing: list  # in our model, not in the checkpoint (left freshly initialised)
    unused: list  # in the checkpoint, not in our model (optimizer slots excluded)


# ------------------------------------------------------------------ loading
def _assign(names: Mapping[str, Any], values: Mapping[str, np.ndarray], source: str, config: BertConfig) -> None:
    for name, variable in names.items():
        value = values[name]
        want = tuple(variable.shape)
        if tuple(value.shape) != want:
            if name == "bert/embeddings/word_embeddings" and value.shape[1:] == want[1:]:
                raise CheckpointError(
                    f"{source}: vocab size mismatch: {name} has shape {list(value.shape)} in the checkpoint "
                    f"but {list(want)} in the model (bert_config vocab_size={config.vocab_size})"
                )
            raise CheckpointError(
                f"{source}: {name} has shape {list(value.shape)} in the checkpoint but "
                f"{list(want)} in the model built from bert_config"
            )
    for name, variable in names.items():
        variable.assign(np.asarray(values[name], dtype=np.float32))


def _check_encoder_coverage(report: LoadReport, source: str) -> None:
    """Every encoder variable must come from the checkpoint, and no encoder variable may be left over."""
    missing = [n for n in report.missing if n.startswith("bert/")]
    extra = [n for n in report.unused if n.startswith("bert/")]
    if missing or extra:
        what = f"has no {missing[0]}" if missing else f"has {extra[0]}, which the model does not"
        raise CheckpointError(
            f"{source}: checkpoint does not match bert_config ({what}; "
            f"{len(missing)} missing, {len(extra)} extra encoder variables)"
        )


def resolve_tf1_checkpoint(path: str) -> str:
    """A checkpoint prefix from a prefix or a folder (its latest checkpoint: the `checkpoint` state
    file's, else the highest step: bert_tf.model_dir.latest_checkpoint; else bert_model.ckpt)."""


    if tf.io.gfile.isdir(path):
        path = model_dir.latest_checkpoint(path) or os.path.join(path, "bert_model.ckpt")
    if not tf.io.gfile.exists(path + ".index"):
        raise CheckpointError(f"{path}: no checkpoint found (expected {path}.index)")
    return path


def _reader(path: str):
    """A checkpoint reader for a resolved prefix; unreadable files become a one-line CheckpointError."""

    try:
        return tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise CheckpointError(f"{path}: cannot read checkpoint ({first})") from None


def variable_names(path: str) -> Dict[str, list]:
    """Variable name -> shape of the checkpoint at `path` (a prefix, or a folder: its latest checkpoint)."""
    return _reader(resolve_tf1_checkpoint(path)).get_variable_to_shape_map()


def _is_model_variable(name: str) -> bool:
    return name not in _NON_MODEL_NAMES and not name.endswith(_OPTIMIZER_SUFFIXES)


def load_tf1_checkpoint(model, ckpt_path: str) -> LoadReport:
    """Loads an original TF1 checkpoint into `model` (encoder, pretrainer or task model).

    Encoder variables must all be present with the right shapes; heads the
    checkpoint does not have stay freshly initialised (the original's
    init_from_checkpoint rule), and the report lists them.
    """

    path = resolve_tf1_checkpoint(ckpt_path)
    reader = _reader(path)
    shapes = reader.get_variable_to_shape_map()
    if "_CHECKPOINTABLE_OBJECT_GRAPH" in shapes and not any(n.startswith("bert/") for n in shapes):
        raise CheckpointError(f"{path}: a TF2 object-based checkpoint, not an original TF1 one; use load_checkpoint")
    names = tf1_variable_map(model)
    present = {n for n in shapes if _is_model_variable(n)}
    report = LoadReport(
        loaded=sorted(n for n in names if n in present),
        missing=sorted(n for n in names if n not in present),
        unused=sorted(n for n in present if n not in names),
    )
    _check_encoder_coverage(report, path)
    values = {n: reader.get_tensor(n) for n in report.loaded}
    _assign({n: names[n] for n in report.loaded}, values, path, encoder_of(model).config)
    return report


def _hf_files(path: str):
    """(safetensors file, config.json or None) for a file or a folder."""
    if os.path.isdir(path):
        weights = os.path.join(path, "model.safetensors")
        config = os.path.join(path, "config.json")
        if not os.path.exists(weights):
            other = [f for f in ("pytorch_model.bin", "tf_model.h5") if os.path.exists(os.path.join(path, f))]
            hint = f" (found {other[0]}; only safetensors is read)" if other else ""
            raise CheckpointError(f"{path}: no model.safetensors in this folder{hint}")
        return weights, (config if os.path.exists(config) else None)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such file or folder")
    if not path.endswith(".safetensors"):
        raise CheckpointError(f"{path}: expected a .safetensors file or a folder holding model.safetensors")
    config = os.path.join(os.path.dirname(path), "config.json")
    return path, (config if os.path.exists(config) else None)


def hf_config_to_bert_config(config) -> BertConfig:
    """A `BertConfig` from a Hugging Face BERT `config.json` (a path, its folder, or the dict).

    Hugging Face's "gelu" is the exact erf GELU ("gelu_exact" here); see `BertConfig.from_dict`.
    """
    if isinstance(config, (str, os.PathLike)):
        path = str(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.exists(path):
            raise ConfigError(f"{path}: Hugging Face config.json not found")
        return BertConfig.from_json_file(path, hf=True)
    return BertConfig.from_dict(config, hf=True)


_HF_IGNORED = re.compile(r"(^|\.)(position_ids|cls\.predictions\.decoder\.(weight|bias))$")


def _read_safetensors(path: str) -> Dict[str, np.ndarray]:
    from safetensors import safe_open

    out = {}
    with safe_open(path, framework="numpy") as f:
        for key in f.keys():
            out[key] = f.get_tensor(key)
    return out


def _hf_state_to_tf1(state: Mapping[str, np.ndarray], names: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    """HF tensors renamed to TF1 names (kernels transposed); unknown HF names keep theirs."""
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    values, used = {}, set()
    for tf1 in names:
        candidates = [hf_name(tf1, prefix)]
        if candidates[0].endswith("LayerNorm.weight"):  # older files: gamma / beta
            candidates.append(candidates[0][: -len("weight")] + "gamma")
        elif candidates[0].endswith("LayerNorm.bias"):
            candidates.append(candidates[0][: -len("bias")] + "beta")
        for key in candidates:
            if key in state:
                value = np.asarray(state[key], dtype=np.float32)
                values[tf1] = value.T if tf1.endswith("/kernel") else value
                used.add(key)
                break
    for key in state:
        if key not in used and not _HF_IGNORED.search(key):
            # Map leftover encoder names to the TF1 spelling so coverage checks can name them.
            bare = key[len(prefix) :] if prefix and key.startswith(prefix) else key
            if bare.startswith(("embeddings.", "encoder.", "pooler.")):
                values["bert/" + bare.replace(".", "/")] = None
            else:
                values[key] = None
    return values


def load_hf_weights(model, path: str) -> LoadReport:
    """Loads Hugging Face BERT weights (`model.safetensors`, or a folder with it) into `model`.

    When `config.json` sits beside the weights it must describe the same model
    as the one built here.
    """
    weights_file, config_file = _hf_files(path)
    config = encoder_of(model).config
    if config_file:
        hf_config = hf_config_to_bert_config(config_file)
        for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            if getattr(hf_config, field) != getattr(config, field):
                raise CheckpointError(
                    f"{config_file}: {field} is {getattr(hf_config, field)} but the model's bert_config says "
                    f"{getattr(config, field)}"
                )
    names = tf1_variable_map(model)
    values = _hf_state_to_tf1(_read_safetensors(weights_file), names)
    present = {n for n, v in values.items() if v is not None}
    report = LoadReport(
        loaded=sorted(n for n in names if n in present),
        missing=sorted(n for n in names if n not in present),
        unused=sorted(n for n in values if n not in names),
    )
    _check_encoder_coverage(report, weights_file)
    _assign({n: names[n] for n in report.loaded}, values, weights_file, config)
    return report


# ------------------------------------------------------------------ writing
def _rename_checkpoint_files(tmp_prefix: str, prefix: str) -> None:
    """Moves `<tmp>.data-*` then `<tmp>.index` to `prefix`: the index, written last, marks it complete."""

    for data in tf.io.gfile.glob(tmp_prefix + ".data-*"):
        tf.io.gfile.rename(data, prefix + data[len(tmp_prefix) :], overwrite=True)
    tf.io.gfile.rename(tmp_prefix + ".index", prefix + ".index", overwrite=True)


def write_tf1_checkpoint(model, path: str, global_step: Optional[int] = None) -> str:
    """Writes `model`'s weights as an original TF1 checkpoint at prefix `path` (float32, original names).

    `tf.train.load_checkpoint(path)` then reads exactly the original names; the
    original tools (run_classifier.py --init_checkpoint=...) can load it.
    """

    names = tf1_variable_map(model)
    tensors = {n: tf.constant(np.asarray(v.numpy(), dtype=np.float32)) for n, v in names.items()}
    if global_step is not None:
        tensors["global_step"] = tf.constant(global_step, dtype=tf.int64)
    ordered = sorted(tensors)
    folder = os.path.dirname(path)
    if folder:
        tf.io.gfile.makedirs(folder)
    tmp = f"{path}.tmp-{os.getpid()}"
    tf.raw_ops.SaveV2(
        prefix=tmp,
        tensor_names=ordered,
        shape_and_slices=[""] * len(ordered),
        tensors=[tensors[n] for n in ordered],
    )
    _rename_checkpoint_files(tmp, path)
    return path


def write_checkpoint(model, path: str) -> str:
    """Writes our own (TF2 object-based) checkpoint at prefix `path`: tf.train.Checkpoint(model=model)."""

    tmp = f"{path}.tmp-{os.getpid()}"
    tf.train.Checkpoint(**{CHECKPOINT_MODEL_KEY: model}).write(tmp)
    _rename_checkpoint_files(tmp, path)
    return path


def load_checkpoint(model, path: str) -> None:
    """Restores our own checkpoint (or a training checkpoint with optimizer state) into `model`.

    The encoder must match completely; heads are restored when the checkpoint
    has them (a classifier initialised from a pretraining checkpoint keeps its
    fresh head).
    """

    path = resolve_tf1_checkpoint(path)
    keys = _reader(path).get_variable_to_shape_map()
    if "_CHECKPOINTABLE_OBJECT_GRAPH" not in keys:
        raise CheckpointError(f"{path}: an original TF1 checkpoint, not ours; use load_tf1_checkpoint")
    encoder = encoder_of(model)
    saved_encoder_alone = any(k.startswith(f"{CHECKPOINT_MODEL_KEY}/embeddings/") for k in keys)
    root = encoder if saved_encoder_alone else tf.train.Checkpoint(encoder=encoder)
    try:
        # A training checkpoint's optimizer slots and step are deliberately left unread (no warning each).
        status = tf.train.Checkpoint(**{CHECKPOINT_MODEL_KEY: root}).read(path).expect_partial()
        status.assert_existing_objects_matched()
        if model is not encoder and not saved_encoder_alone:
            tf.train.Checkpoint(**{CHECKPOINT_MODEL_KEY: model}).read(path).expect_partial()
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
        first = str(e).strip().splitlines()[0][:300]
        raise CheckpointError(f"{path}: checkpoint does not match the model built from bert_config ({first})") from None


# ------------------------------------------------------------------ writing Hugging Face
HF_WEIGHTS_FILE = "model.safetensors"
HF_CONFIG_FILE = "config.json"
OUTPUT_FORMATS = ("ours", "tf1", "hf")


def require_cls_pooling(model, target: str) -> None:
    """One line for a classifier that reads the mean of its tokens (BertClassifier pooling="mean"): `target`'s
    classifiers read the pooler at [CLS], so its weights there would give other numbers."""
    if getattr(model, "pooling", "cls") != "cls":
        raise CheckpointError(f"a classifier on the mean of its tokens (--pooling=mean) has no {target} "
                              "equivalent to write (that reads the pooler at [CLS])")


def _hf_layout(model, label_list=None):
    """(transformers class name, name prefix of the encoder, extra config.json keys) for `model`."""

    encoder = encoder_of(model)
    if encoder.causal:
        raise CheckpointError("a left-to-right (causal) model has no Hugging Face BERT equivalent to write")
    if model is encoder:
        return "BertModel", "", {}
    masked_lm, next_sentence = getattr(model, "masked_lm", None), getattr(model, "next_sentence", None)
    if masked_lm is not None:
        return ("BertForPreTraining" if next_sentence is not None else "BertForMaskedLM"), "bert.", {}
    head = getattr(model, "head", None)
    if isinstance(head, heads.SpanHead):
        return "BertForQuestionAnswering", "bert.", {}
    if isinstance(head, heads.MultipleChoiceHead):
        return "BertForMultipleChoice", "bert.", {}
    require_cls_pooling(model, "Hugging Face BertForSequenceClassification")
    if isinstance(head, (heads.ClassificationHead, heads.TokenTaggingHead)):
        num_labels = int(head.projection.output_weights.shape[0])
        labels = [str(x) for x in label_list] if label_list and len(label_list) == num_labels else None
        labels = labels or [f"LABEL_{i}" for i in range(num_labels)]
        extra = {"id2label": dict(enumerate(labels)), "label2id": {x: i for i, x in enumerate(labels)}}
        if num_labels == 1 and isinstance(head, heads.ClassificationHead):
            extra["problem_type"] = "regression"
        name = "BertForSequenceClassification" if isinstance(head, heads.ClassificationHead) else "BertForTokenClassification"
        return name, "bert.", extra
    raise CheckpointError(f"no Hugging Face layout for {type(model).__name__}")


def hf_state_dict(model, prefix: str) -> Dict[str, np.ndarray]:
    """`model`'s weights under their Hugging Face names (Linear weights [out, in]), float32.

    The MLM decoder weight and bias are tied to the word embeddings and `cls.predictions.bias` in
    transformers and are not written (as `save_pretrained` does not).
    """
    out = {}
    for name, variable in tf1_variable_map(model).items():
        value = np.asarray(variable.numpy(), dtype=np.float32)
        out[hf_name(name, prefix)] = np.ascontiguousarray(value.T if name.endswith("/kernel") else value)
    return out


def _write_bytes_atomic(path: str, data: bytes) -> None:

    tmp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(tmp, "wb") as f:
        f.write(data)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def write_hf_checkpoint(
    model,
    folder: str,
    vocab_file: Optional[str] = None,
    do_lower_case: Optional[bool] = None,
    label_list=None,
) -> str:
    """Writes `model` as a Hugging Face folder: model.safetensors, config.json, and vocab.txt (plus
    tokenizer_config.json when the casing is known), loadable by `transformers` `from_pretrained`.

    The class is the one matching the heads: BertModel (encoder), BertForPreTraining (MLM + NSP),
    BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification,
    BertForMultipleChoice or BertForQuestionAnswering. Each file goes through a temporary name;
    config.json is written last.
    """
    from safetensors.numpy import save as safetensors_bytes


    config = encoder_of(model).config
    architecture, prefix, extra = _hf_layout(model, label_list)
    if tf.io.gfile.exists(folder) and not tf.io.gfile.isdir(folder):
        raise CheckpointError(f"{folder}: exists and is not a folder (a Hugging Face output is a folder)")
    tf.io.gfile.makedirs(folder)
    tensors = hf_state_dict(model, prefix)
    _write_bytes_atomic(os.path.join(folder, HF_WEIGHTS_FILE), safetensors_bytes(tensors, metadata={"format": "pt"}))
    if vocab_file:
        _copy_atomic(vocab_file, os.path.join(folder, "vocab.txt"))
    if do_lower_case is not None:
        tokenizer_config = {"do_lower_case": bool(do_lower_case), "tokenizer_class": "BertTokenizer",
                            "model_max_length": config.max_position_embeddings}
        write_text_atomic(os.path.join(folder, "tokenizer_config.json"),
                          json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    hf_config = config.to_hf_dict(architectures=[architecture], **extra)
    write_text_atomic(os.path.join(folder, HF_CONFIG_FILE), json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    return folder


def _copy_atomic(src: str, dst: str) -> None:

    if os.path.abspath(src) == os.path.abspath(dst):
        return
    tmp = f"{dst}.tmp-{os.getpid()}"
    tf.io.gfile.copy(src, tmp, overwrite=True)
    tf.io.gfile.rename(tmp, dst, overwrite=True)


# ------------------------------------------------------------------ detecting and converting
def detect_format(path: str) -> str:
    """The format of a checkpoint path ("hf", "tf1" or "ours"): a prefix, folder or .safetensors file."""

    if path.endswith(".safetensors") or (
        os.path.isdir(path) and os.path.exists(os.path.join(path, "model.safetensors"))
    ):
        return "hf"
    keys = variable_names(path)
    return "ours" if "_CHECKPOINTABLE_OBJECT_GRAPH" in keys else "tf1"


def checkpoint_variable_shapes(path: str, fmt: str) -> Dict[str, list]:
    """TF1-spelled variable names -> shapes found in a tf1 or hf checkpoint (to pick the heads to build)."""

    if fmt == "tf1":
        return {
            n: s
            for n, s in variable_names(path).items()
            if _is_model_variable(n)
        }
    from safetensors import safe_open

    weights_file, _ = _hf_files(path)
    reverse = {v: k for k, v in _HF_SPECIAL.items()}
    with safe_open(weights_file, framework="numpy") as f:
        return {reverse.get(k, k): list(f.get_slice(k).get_shape()) for k in f.keys()}


def build_model_for_checkpoint(config: BertConfig, shapes: Mapping[str, list]):
    """The model whose variables cover the checkpoint's heads: pretrainer, classifier, span labeler or encoder."""

    if "cls/predictions/output_bias" in shapes:
        return BertPretrainer(config, use_next_sentence_prediction="cls/seq_relationship/output_weights" in shapes)
    if "cls/squad/output_weights" in shapes:
        return BertSpanLabeler(BertEncoder(config))
    if "output_weights" in shapes:
        return BertClassifier(BertEncoder(config), num_labels=int(shapes["output_weights"][0]))
    return BertEncoder(config)


def load_pretrained(model, path: str, fmt: Optional[str] = None) -> LoadReport | None:
    """Loads weights from any supported format into `model`; `fmt` is detected when None."""
    fmt = fmt or detect_format(path)
    if fmt == "tf1":
        return load_tf1_checkpoint(model, path)
    if fmt == "hf":
        return load_hf_weights(model, path)
    if fmt == "ours":
        load_checkpoint(model, path)
        return None
    raise ValueError(f"unknown checkpoint format {fmt!r}; expected tf1, hf or ours")


def convert_checkpoint(
    input_path: str,
    output_path: str,
    output_format: str,
    bert_config: Optional[BertConfig] = None,
    input_format: Optional[str] = None,
    vocab_file: Optional[str] = None,
) -> str:
    """Converts a checkpoint between formats: any of tf1, hf, ours (a prefix, or a bert_tf model dir)
    to tf1, ours or hf.

    `bert_config` defaults to the bert_config.json beside the input (config.json for hf). tf1 and
    ours outputs are a prefix with `bert_config.json` (and `vocab.txt` when one is given or sits
    beside the input) next to it; hf output is a folder (see `write_hf_checkpoint`). The original
    code knows only the tanh "gelu" and LayerNorm epsilon 1e-12: a tf1 output of a model with
    gelu_exact or another epsilon is written with the original's values and a one-line warning.
    Returns the output prefix (folder for hf).
    """
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"unknown output format {output_format!r}; expected {', '.join(OUTPUT_FORMATS)}")
    model, bert_config, info = _model_to_convert(input_path, bert_config, input_format)
    vocab_file = vocab_file or vocab_beside(input_path)
    if output_format == "hf":
        if info.get("causal_attention"):
            raise CheckpointError(f"{input_path}: a left-to-right (causal) model has no Hugging Face BERT equivalent")
        casing = info.get("do_lower_case")
        return write_hf_checkpoint(model, output_path, vocab_file, None if casing is None else bool(casing),
                                   info.get("label_list"))
    if output_format == "tf1":
        require_cls_pooling(model, "original TF1")
    folder = os.path.dirname(output_path)
    if folder:
        tf.io.gfile.makedirs(folder)
    if output_format == "tf1":
        bert_config, changes = bert_config.original_compatible()
        for change in changes:
            logger.warning("%s: %s", output_path, change)
        write_tf1_checkpoint(model, output_path)
    else:
        write_checkpoint(model, output_path)

    model_dir.write_config(folder, bert_config)
    if vocab_file:
        _copy_atomic(vocab_file, model_dir.vocab_path(folder))
    return output_path


def _model_to_convert(input_path: str, bert_config: Optional[BertConfig], input_format: Optional[str]):
    """(model with the input's weights and heads, its BertConfig, facts known about it: do_lower_case,
    label_list, causal_attention)."""

    folder = input_path if os.path.isdir(input_path) else os.path.dirname(input_path)
    info = read_run_info(folder) if folder else {}
    if os.path.isdir(input_path) and info.get("task_type") not in (None, "pretraining"):
        # A fine-tuned model dir: its task model, heads and labels as the runners saved them.

        model = model_dir.restore(input_path)
        return model, encoder_of(model).config, info

    input_format = input_format or detect_format(input_path)
    if bert_config is None:

        beside = model_dir.config_path(folder)
        if input_format == "hf":
            _, config_file = _hf_files(input_path)
            if config_file is None:
                raise ConfigError(f"{input_path}: no config.json beside the weights; pass a bert_config")
            bert_config = hf_config_to_bert_config(config_file)
        elif os.path.exists(beside):
            bert_config = BertConfig.from_json_file(beside)
        else:
            raise ConfigError(f"{input_path}: a bert_config is needed to read a {input_format} checkpoint")
    if input_format == "ours":
        keys = variable_names(input_path)
        heads = {"masked_lm": "cls/predictions/output_bias", "next_sentence": "cls/seq_relationship/output_weights"}
        shapes = {
            tf1: [] for key, tf1 in heads.items() if any(k.startswith(f"{CHECKPOINT_MODEL_KEY}/{key}/") for k in keys)
        }
    else:
        shapes = checkpoint_variable_shapes(input_path, input_format)
    model = build_model_for_checkpoint(bert_config, shapes)
    load_pretrained(model, input_path, input_format)
    if "do_lower_case" not in info:
        casing = hf_do_lower_case(folder) if input_format == "hf" else expected_casing(input_path)
        if casing is not None:
            info = {**info, "do_lower_case": casing}
    return model, bert_config, info


def hf_do_lower_case(folder: str) -> Optional[bool]:
    """The casing a Hugging Face folder's tokenizer_config.json records, or None (no file, no entry)."""
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f).get("do_lower_case")
    except (json.JSONDecodeError, AttributeError):
        return None
    return None if value is None else bool(value)


def vocab_beside(path: str) -> Optional[str]:
    """The vocab.txt in a checkpoint's folder (`path` a prefix or the folder), or None."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    candidate = model_dir.vocab_path(folder)
    return candidate if os.path.exists(candidate) else None
