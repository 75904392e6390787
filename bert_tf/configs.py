"""`BertConfig`: the model hyper-parameters, read from and written to `bert_config.json`.

The file format is the original's (docs/reference.md §1): the same keys, JSON with
indent 2 and sorted keys. Released configs carry a few extra, unused keys
(`directionality`, `pooler_*`); they are accepted and ignored.

Casing (`do_lower_case`) is not part of the original config. We store it next to
our own checkpoints (`bert_tf_info.json`, see `write_run_info`) and, for original
checkpoints, keep the original's folder-name guess (`check_casing`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Mapping, Optional, Tuple

from bert_tf import fileio
from bert_tf.errors import ConfigError
from bert_tf.fileio import write_text_atomic

# hidden_act values. "gelu" is the tanh approximation, as in the original's bert_config.json (its
# `modeling.get_activation` knows gelu, relu, tanh, linear). "gelu_exact" is the erf GELU, what a
# Hugging Face config.json calls "gelu"; the original code cannot run it.
KNOWN_ACTIVATIONS = ("gelu", "gelu_exact", "relu", "tanh", "linear")
# The original's LayerNorm epsilon; `layer_norm_eps` is written to bert_config.json only when it differs.
DEFAULT_LAYER_NORM_EPS = 1e-12

# Keys released configs carry that the model never reads (docs/reference.md §1).
IGNORED_KEYS = frozenset(
    {
        "directionality",
        "pooler_fc_size",
        "pooler_num_attention_heads",
        "pooler_num_fc_layers",
        "pooler_size_per_head",
        "pooler_type",
    }
)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT encoder, as in the original `bert_config.json`."""

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    # The original code default is 16; every released config says 2.
    type_vocab_size: int = 16
    initializer_range: float = 0.02
    # Not in the original's files (its LayerNorm always uses 1e-12); Hugging Face configs set it.
    layer_norm_eps: float = DEFAULT_LAYER_NORM_EPS

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self, source: str = "BertConfig") -> None:
        int_fields = (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        )
        for name in int_fields:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{source}: {name} must be an integer, got {value!r}")
            if value <= 0:
                raise ConfigError(f"{source}: {name} must be positive, got {value}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{source}: {name} must be a number, got {value!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{source}: {name} must be in [0, 1), got {getattr(self, name)}")
        if self.initializer_range <= 0:
            raise ConfigError(f"{source}: initializer_range must be positive, got {self.initializer_range}")
        if not 0 < self.layer_norm_eps < 1:
            raise ConfigError(f"{source}: layer_norm_eps must be in (0, 1), got {self.layer_norm_eps}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{source}: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in KNOWN_ACTIVATIONS:
            raise ConfigError(
                f"{source}: unknown hidden_act {self.hidden_act!r}; expected one of {', '.join(KNOWN_ACTIVATIONS)}"
            )

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # --------------------------------------------------------------- builders
    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config", hf: Optional[bool] = None) -> "BertConfig":
        """A config from the original's bert_config.json keys or, when `hf` (None: when the keys say so,
        see `is_hf_config`), from a Hugging Face config.json."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source}: expected a JSON object, got {type(values).__name__}")
        if hf or (hf is None and is_hf_config(values)):
            return cls.from_dict(_from_hf(values, source), source=source, hf=False)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known - IGNORED_KEYS)
        if unknown:
            hint = " (a Hugging Face config.json must say model_type)" if set(unknown) & _HF_ONLY_KEYS else ""
            raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)}{hint}")
        if "vocab_size" not in values:
            raise ConfigError(f"{source}: missing required field vocab_size")
        kwargs = {k: v for k, v in values.items() if k in known}
        # JSON has one number type; accept 2.0 for an int field only when exact.
        for f in dataclasses.fields(cls):
            v = kwargs.get(f.name)
            if f.type == "int" and isinstance(v, float) and v.is_integer():
                kwargs[f.name] = int(v)
        obj = cls.__new__(cls)
        for f in dataclasses.fields(cls):
            object.__setattr__(obj, f.name, kwargs.get(f.name, f.default))
        obj.validate(source)
        return obj

    @classmethod
    def from_json_file(cls, path: str, hf: Optional[bool] = None) -> "BertConfig":
        """Reads an original bert_config.json or a Hugging Face config.json (told apart by `is_hf_config`)."""
        if not fileio.exists(path):
            raise ConfigError(f"{path}: bert config file not found")
        with fileio.open_file(path, "r") as f:
            text = f.read()
        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(values, source=path, hf=hf)

    @classmethod
    def named(cls, name: str, vocab_size: int = 30522, **overrides) -> "BertConfig":
        """A released size by name: tiny, mini, small, medium, base, large."""
        if name not in RELEASED_SIZES:
            raise ConfigError(f"unknown model size {name!r}; expected one of {', '.join(RELEASED_SIZES)}")
        layers, hidden = RELEASED_SIZES[name]
        values = dict(
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden,
            type_vocab_size=2,
        )
        values.update(overrides)
        return cls(**values)

    # ---------------------------------------------------------------- writers
    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        if values["layer_norm_eps"] == DEFAULT_LAYER_NORM_EPS:
            del values["layer_norm_eps"]  # the original's keys only, unless the model needs more
        return values

    def to_hf_dict(self, architectures=("BertModel",), **extra) -> dict:
        """The Hugging Face config.json of this model (`transformers.BertConfig` keys); `extra` is
        added as is (e.g. id2label)."""
        values = dataclasses.asdict(self)
        values.update(
            architectures=list(architectures),
            model_type="bert",
            hidden_act=_TO_HF_ACTIVATION[self.hidden_act],
            position_embedding_type="absolute",
            pad_token_id=0,
            torch_dtype="float32",
            **extra,
        )
        return values

    def original_compatible(self) -> tuple:
        """(a config the original code can run, [what had to change]): its files know only the tanh
        "gelu" and LayerNorm epsilon 1e-12."""
        changes, config = [], self
        if self.hidden_act == "gelu_exact":
            changes.append("hidden_act gelu_exact (erf) written as gelu: the original code has only the tanh "
                           "approximation (real MiniLM last-layer states move by up to ~8e-3)")
            config = config.replace(hidden_act="gelu")
        if self.layer_norm_eps != DEFAULT_LAYER_NORM_EPS:
            changes.append(f"layer_norm_eps {self.layer_norm_eps} not written: the original code always uses 1e-12")
            config = config.replace(layer_norm_eps=DEFAULT_LAYER_NORM_EPS)
        return config, changes

    def to_json_string(self) -> str:
        # The original: json.dumps(..., indent=2, sort_keys=True) + "\n".
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str) -> None:
        write_text_atomic(path, self.to_json_string())

    def replace(self, **changes) -> "BertConfig":
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------ Hugging Face config.json
# Keys that only a Hugging Face config.json has; any one of them marks a file as one.
_HF_MARKERS = frozenset({"model_type", "architectures", "transformers_version", "_name_or_path"})
_HF_ONLY_KEYS = _HF_MARKERS | {"pad_token_id", "position_embedding_type", "use_cache", "torch_dtype",
                                "gradient_checkpointing", "classifier_dropout"}
# Hugging Face hidden_act -> ours. There "gelu" (and "gelu_python") is the erf GELU; "gelu_new",
# "gelu_pytorch_tanh", "gelu_fast" and "gelu_accurate" all compute the tanh approximation.
_FROM_HF_ACTIVATION = {
    "gelu": "gelu_exact", "gelu_python": "gelu_exact",
    "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu", "gelu_accurate": "gelu",
    "relu": "relu", "tanh": "tanh", "linear": "linear",
}
_TO_HF_ACTIVATION = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "tanh": "tanh", "linear": "linear"}
# transformers.BertConfig's defaults, for keys a config.json leaves out.
_HF_DEFAULTS = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12,
}
# Keys that change the computation, with the only value we can run; every other key a
# config.json carries (_name_or_path, architectures, torch_dtype, use_cache, pad_token_id,
# id2label, classifier_dropout, ...) is bookkeeping here and ignored.
_HF_REQUIRED_VALUES = {
    "position_embedding_type": "absolute",
    "is_decoder": False,
    "add_cross_attention": False,
    "tie_word_embeddings": True,
    "pruned_heads": {},
}


def is_hf_config(values: Mapping[str, Any]) -> bool:
    """True for a Hugging Face config.json (it has model_type, architectures, transformers_version or
    _name_or_path, which the original's bert_config.json never has)."""
    return bool(_HF_MARKERS & set(values))


def asks_gradient_checkpointing(path: str) -> bool:
    """True for a Hugging Face config.json that says "gradient_checkpointing": true (transformers' former way
    to ask for it). A training setting, not a model's: BertConfig leaves it out, the training scripts read
    it here and turn it on (bert_setup.use_gradient_checkpointing). False for any other file or one that
    does not parse (reading the config reports that)."""
    try:
        with fileio.open_file(path, "r") as f:
            values = json.loads(f.read())
    except (OSError, ValueError):
        return False
    return isinstance(values, Mapping) and is_hf_config(values) and values.get("gradient_checkpointing") is True


def _from_hf(values: Mapping[str, Any], source: str) -> dict:
    """The BertConfig fields of a Hugging Face BERT config.json; a one-line ConfigError for a model we
    would compute differently."""
    model_type = values.get("model_type", "bert")
    if model_type != "bert":
        raise ConfigError(f"{source}: model_type is {model_type!r}; only BERT models can be loaded")
    for key, expected in _HF_REQUIRED_VALUES.items():
        value = values.get(key)
        if value is not None and value != expected:
            raise ConfigError(f"{source}: {key} {value!r} is not supported (only {expected!r})")
    out = {k: values.get(k, default) for k, default in _HF_DEFAULTS.items()}
    if out["hidden_act"] not in _FROM_HF_ACTIVATION:
        raise ConfigError(
            f"{source}: hidden_act {out['hidden_act']!r} is not supported; expected one of "
            f"{', '.join(_FROM_HF_ACTIVATION)}"
        )
    out["hidden_act"] = _FROM_HF_ACTIVATION[out["hidden_act"]]
    return out


# Released sizes (docs/reference.md §1): name -> (layers, hidden); heads = H/64, intermediate = 4H.
RELEASED_SIZES = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}


# ------------------------------------------------------------------ casing
RUN_INFO_FILE = "bert_tf_info.json"

_UNCASED_PREFIXES = ("uncased_L-24_H-1024_A-16", "uncased_L-12_H-768_A-12", "multilingual_L-12_H-768_A-12", "chinese_L-12_H-768_A-12")
_CASED_PREFIXES = ("cased_L-12_H-768_A-12", "cased_L-24_H-1024_A-16", "multi_cased_L-12_H-768_A-12")


CasingMismatchError = ConfigError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


# What a fine-tuned (or pretrained) model dir holds: bert_tf_info.json's task_type, each with its model
# builder in bert_tf.model_dir.TASK_MODELS.
TASK_TYPES = ("classification", "regression", "span", "multiple_choice", "tagging", "pretraining")


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """The task of a fine-tuned model dir as bert_tf_info.json records it: what builds its model
    (bert_tf.model_dir.TASK_MODELS), what a resumed run must match (MATCHED), and the task's settings that the export
    and later runs read. A runner's FinetuneTask.setup makes one; `from_info` reads one back (with a
    one-line error for a field of the wrong kind); `to_info` is its part of bert_tf_info.json.
    """

    task_type: str
    task: Optional[str] = None  # e.g. "MRPC", "user", "squad", "swag", "ner"
    label_list: Optional[Tuple[str, ...]] = None  # classification and tagging
    num_choices: Optional[int] = None  # multiple choice
    feature_based: bool = False  # tagging: the BiLSTM on frozen features (run_ner.py --feature_based)
    feature_layers: Optional[str] = None  # its layer combination spec
    causal_attention: bool = False  # a left-to-right (--objective=ltr) encoder
    # settings, not matched on resume: windows (classifier, tagger) and SQuAD's lengths
    long_inputs: Optional[str] = None
    doc_stride: Optional[int] = None
    window_aggregation: Optional[str] = None
    window_training: Optional[str] = None  # "each" window, or the "aggregate" of an input's windows
    pooling: Optional[str] = None  # classifier: "mean" of the tokens; None: the pooler at [CLS]
    absent_label: Optional[str] = None  # classifier windows: the label meaning "found nowhere" (label_list's first)
    version_2_with_negative: Optional[bool] = None
    max_query_length: Optional[int] = None

    MATCHED = ("task_type", "task", "label_list", "num_choices", "feature_based", "feature_layers")

    @classmethod
    def from_info(cls, info: dict) -> "TaskRecord":
        task_type = info.get("task_type")
        if task_type not in TASK_TYPES:
            raise ConfigError(f"{RUN_INFO_FILE}: task_type {task_type!r}; expected one of {', '.join(TASK_TYPES)}")
        labels = info.get("label_list")
        needs_labels = task_type in ("classification", "tagging")
        if (labels is not None or needs_labels) and not (
                isinstance(labels, list) and all(isinstance(x, str) for x in labels) and (labels or not needs_labels)):
            kind = "a non-empty list of str" if needs_labels else "a list of str"
            raise ConfigError(f"{RUN_INFO_FILE}: label_list must be {kind} for task_type {task_type}")
        fields = {f.name for f in dataclasses.fields(cls)}
        record = cls(**{k: v for k, v in info.items() if k in fields and k != "label_list"},
                     label_list=None if labels is None else tuple(labels))
        if task_type == "multiple_choice" and not (isinstance(record.num_choices, int) and record.num_choices >= 2):
            raise ConfigError(f"{RUN_INFO_FILE}: num_choices must be an int >= 2 for task_type multiple_choice")
        if record.feature_based and not isinstance(record.feature_layers, str):
            raise ConfigError(f"{RUN_INFO_FILE}: feature_layers must be a layer combination for a feature-based tagger")
        return record

    def to_info(self) -> dict:
        """The fields that say something (None left out, and the two flags when off), label_list a JSON list."""
        info = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None
                and not (f.name in ("feature_based", "causal_attention") and not getattr(self, f.name))}
        if self.label_list is not None:
            info["label_list"] = list(self.label_list)
        return info


def write_run_info(model_dir: str, *, do_lower_case: bool, **extra) -> None:
    """Stores facts the original left to folder names (casing, objective, ...) beside a checkpoint."""
    info = {"do_lower_case": bool(do_lower_case), **extra}
    write_text_atomic(os.path.join(model_dir, RUN_INFO_FILE), json.dumps(info, indent=2, sort_keys=True) + "\n")


def read_run_info(model_dir: str) -> dict:
    path = os.path.join(model_dir, RUN_INFO_FILE)
    if not fileio.exists(path):
        return {}
    with fileio.open_file(path, "r") as f:
        return json.load(f)


def expected_casing(init_checkpoint: str) -> Optional[bool]:
    """The casing a checkpoint was trained with, or None when nothing says.

    Our own checkpoints record it in `bert_tf_info.json`; for original ones the
    original's rule applies: a released model's folder name tells.
    """
    if not init_checkpoint:
        return None
    folder = os.path.dirname(init_checkpoint) if not os.path.isdir(init_checkpoint) else init_checkpoint
    info = read_run_info(folder)
    if "do_lower_case" in info:
        return bool(info["do_lower_case"])
    m = re.match(r"^.*?([A-Za-z0-9_-]+)/bert_model.ckpt", init_checkpoint)
    if not m:
        return None
    name = m.group(1)
    if name in _UNCASED_PREFIXES:
        return True
    if name in _CASED_PREFIXES:
        return False
    return None


def check_casing(do_lower_case: bool, init_checkpoint: str, allow_mismatch: bool = False) -> Optional[str]:
    """Raises (or, with `allow_mismatch`, returns a warning) when casing disagrees with the checkpoint."""
    expected = expected_casing(init_checkpoint)
    if expected is None or expected == bool(do_lower_case):
        return None
    msg = (
        f"do_lower_case={bool(do_lower_case)} but {init_checkpoint} was trained with "
        f"do_lower_case={expected}; pass --do_lower_case={expected}"
        + ("" if allow_mismatch else " (or --allow_casing_mismatch to go on anyway)")
    )
    if allow_mismatch:
        return msg
    raise ConfigError(msg)
