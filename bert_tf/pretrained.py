"""Where a run's weights come from: one answer for every script and for notebooks.

A starting point is what the scripts' --init_checkpoint takes: an original TF1 checkpoint
(`.../bert_model.ckpt`, or its folder), a Hugging Face folder or `.safetensors` file, or a bert_tf
model dir (its latest checkpoint), or nothing (train from scratch).

- `resolve_pretrained` finds its config, vocab, casing, format and causal attention (`Pretrained`);
  `check_lower_case` compares the casing asked for with the recorded one.
- `load_starting_weights` loads it into a freshly built model by the rules every run starts with
  (the encoder must match; heads the checkpoint has are loaded, the others start fresh; an extended
  vocab's new tokens start from their old pieces). Pretraining, fine-tuning and `from_pretrained`
  call it; bert_tf.checkpoints only reads and writes the formats.
- For notebooks, a model and its tokenizer in one call each:

    from bert_tf.models import BertClassifier
    from bert_tf.pretrained import BertTokenizer, from_pretrained

    model = from_pretrained(BertClassifier, path, num_labels=3)    # or from_pretrained(BertEncoder, path)
    tokenizer = BertTokenizer.from_pretrained(path)
    logits = model(tokenizer(["The cat sat.", "A dog ran."], ["It sat.", "It ran."]))  # [2, 3]

Errors are one line (ConfigError, CheckpointError: bert_tf/errors.py).

The tokenizer is named as Hugging Face's, whose role it plays: strings (and
pairs) -> the model's input dict, `[CLS] A [SEP] (B [SEP])` with the pair
truncated as the original (truncate_seq_pair), zero-padded to max_seq_length;
its word pieces are FullTokenizer's (through FastTokenizer), cased as the
checkpoint records.

Dimensions: N texts, S max_seq_length, V vocab size.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from bert_tf import checkpoints, model_dir
from bert_tf.configs import (
    BertConfig,
    TaskRecord,
    asks_gradient_checkpointing,
    check_casing,
    expected_casing,
    read_run_info,
)
from bert_tf.errors import CheckpointError, ConfigError, InputDataError
from bert_tf.models.encoder import BertEncoder
from bert_tf.tasks.glue import pair_to_ids, tokenize_all
from bert_tf.tokenization import check_vocab_fits, load_vocab, vocab_builder
from bert_tf.tokenization.fast import FastTokenizer

logger = logging.getLogger("bert_tf.pretrained")

# The fine-tuning scripts' default --max_seq_length, used when the checkpoint records none.
DEFAULT_MAX_SEQ_LENGTH = 128
RETURN_TENSORS = ("np", "tf")
# The checkpoint prefix in the original's released folders (uncased_L-12_H-768_A-12/bert_model.ckpt).
RELEASED_CHECKPOINT = "bert_model.ckpt"


FinetuneError = ConfigError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """Where a fine-tuning run starts: config, vocab, and the weights to load (if any).

    fmt: "tf1" (original bert_model.ckpt), "hf" (Hugging Face folder or
    .safetensors), "ours" (a bert_tf checkpoint), or None (train from scratch).
    do_lower_case: what the source records about casing, or None.
    pooling: "mean" or "cls" where the source says how it reads a sentence (a sentence-transformers
    folder's pooling config, a bert_tf classifier's run info), else None.
    causal: the encoder attends left to right only (a model pretrained with
    --objective=ltr, as its bert_tf_info.json records); fine-tuning keeps the mask.
    gradient_checkpointing: the config read is a Hugging Face config.json that asks for it
    (configs.asks_gradient_checkpointing); the training scripts turn it on.
    """

    config: BertConfig
    vocab_file: Optional[str]  # None only where no vocab is needed (pretraining reads ids)
    init_checkpoint: Optional[str]
    fmt: Optional[str]
    do_lower_case: Optional[bool]
    causal: bool = False
    pooling: Optional[str] = None  # how the checkpoint reads a sentence, where it says (sentence_pooling)
    gradient_checkpointing: bool = False

    def build_encoder(self):
        """A fresh `BertEncoder` of this config (causal when the checkpoint's is)."""
        return BertEncoder(self.config, causal=self.causal)

    def build_model(self, record: TaskRecord, skip_padding: bool = True):
        """A fresh task model of this config that `record` names (model_dir.build_task_model), causal when
        the checkpoint's encoder is."""
        return model_dir.build_task_model(self.config, dataclasses.replace(record, causal_attention=self.causal),
                                          skip_padding=skip_padding)

    def init_fn(self, model) -> None:
        """Loads the pretrained encoder (and any matching heads) into a fresh task model."""
        if not self.init_checkpoint:
            logger.info("no init_checkpoint: training from random initialisation")
            return
        started = load_starting_weights(model, self.init_checkpoint, self.fmt, self.vocab_file)
        report = started.report
        if report is not None:
            logger.info("loaded %d variables from %s (%s); %d left freshly initialised: %s",
                        len(report.loaded), self.init_checkpoint, self.fmt, len(report.missing),
                        ", ".join(report.missing[:6]) + (" ..." if len(report.missing) > 6 else ""))
        else:
            logger.info("loaded %s (%s)", self.init_checkpoint, self.fmt)

    def tokenizer(self, do_lower_case: bool) -> FastTokenizer:
        """The fast tokenizer: FullTokenizer's exact output and interface, several times faster."""
        return FastTokenizer(self.vocab_file, do_lower_case=do_lower_case)


def sentence_pooling(folder: str) -> Optional[str]:
    """How a sentence-transformers folder (modules.json naming a Pooling module) reads a sentence: "mean"
    when its pooling config averages the tokens and nothing else, "cls" when it takes [CLS] only; None for
    any other folder or mode (max, several at once), and for files that do not parse."""
    try:
        with open(os.path.join(folder, "modules.json"), encoding="utf-8") as f:
            modules = json.load(f)
        [path] = [m["path"] for m in modules if str(m.get("type", "")).endswith(".Pooling")]
        with open(os.path.join(folder, path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        modes = {k[len("pooling_mode_"):] for k, v in config.items() if k.startswith("pooling_mode_") and v is True}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {frozenset({"mean_tokens"}): "mean", frozenset({"cls_token"}): "cls"}.get(frozenset(modes))


def resolve_pretrained(init_checkpoint: Optional[str], bert_config_file: Optional[str] = None,
                       vocab_file: Optional[str] = None, require_vocab: bool = True) -> Pretrained:
    """Finds config, vocab and format for `init_checkpoint`, which may be:

    - an original TF1 prefix (`.../bert_model.ckpt`) or the folder holding it: needs `bert_config_file`
      unless a `bert_config.json` sits beside it, and `vocab_file` unless a `vocab.txt` does;
    - a Hugging Face folder (config.json, model.safetensors, vocab.txt) or .safetensors file;
    - a bert_tf model directory (its latest checkpoint and side files: bert_tf.model_dir),
      or one checkpoint prefix in it;
    - empty: train from scratch with `bert_config_file` and `vocab_file`.
    Flags given explicitly win over files found beside the checkpoint.
    """
    fmt = None
    do_lower_case = None
    causal = False
    folder = None
    pooling = None
    if init_checkpoint:
        if os.path.isdir(init_checkpoint) and not os.path.exists(os.path.join(init_checkpoint, "model.safetensors")):
            try:  # its latest checkpoint, or an original download's bert_model.ckpt
                latest = checkpoints.resolve_tf1_checkpoint(init_checkpoint)
            except CheckpointError:
                raise ConfigError(f"{init_checkpoint}: a folder with no checkpoint (no model checkpoint, "
                                    "no bert_model.ckpt, no model.safetensors)") from None
            folder, init_checkpoint = init_checkpoint, latest
        try:
            fmt = checkpoints.detect_format(init_checkpoint)
        except (CheckpointError, tf.errors.OpError, ValueError) as e:
            raise ConfigError(f"{init_checkpoint}: not a readable checkpoint ({str(e).splitlines()[0]})") from None
        if folder is None:
            folder = init_checkpoint if os.path.isdir(init_checkpoint) else os.path.dirname(init_checkpoint)
        info = read_run_info(folder)
        causal = bool(info.get("causal_attention", False))
        if "do_lower_case" in info:
            do_lower_case = bool(info["do_lower_case"])
        elif fmt == "hf":
            do_lower_case = checkpoints.hf_do_lower_case(folder)
        pooling = sentence_pooling(folder) if fmt == "hf" else \
            info.get("pooling", "cls" if info.get("task_type") in ("classification", "regression") else None)

    if bert_config_file:
        config_file, hf = bert_config_file, None
    elif folder and os.path.exists(model_dir.config_path(folder)):
        config_file, hf = model_dir.config_path(folder), None
    elif fmt == "hf" and os.path.exists(os.path.join(folder, "config.json")):
        config_file, hf = os.path.join(folder, "config.json"), True
    else:
        raise ConfigError("--bert_config_file is required (no bert_config.json or config.json beside the checkpoint)")
    config = BertConfig.from_json_file(config_file, hf=hf)
    checkpointing = asks_gradient_checkpointing(config_file)

    if not vocab_file:
        candidate = model_dir.vocab_path(folder) if folder else None
        if candidate and os.path.exists(candidate):
            vocab_file = candidate
        elif require_vocab:
            raise ConfigError("--vocab_file is required (no vocab.txt beside the checkpoint)")
        else:  # pretraining reads token ids from its records
            return Pretrained(config, None, init_checkpoint, fmt, do_lower_case, causal, pooling, checkpointing)
    try:
        check_vocab_fits(vocab_file, config.vocab_size, init_checkpoint)
    except InputDataError as e:
        raise ConfigError(str(e)) from None
    return Pretrained(config, vocab_file, init_checkpoint, fmt, do_lower_case, causal, pooling, checkpointing)


def recorded_lower_case(pretrained: Pretrained) -> Optional[bool]:
    """The casing the checkpoint records (bert_tf_info.json, a Hugging Face tokenizer_config.json) or its
    released folder's name says (Google's cased_/uncased_ downloads), None when nothing says."""
    if pretrained.do_lower_case is not None:
        return pretrained.do_lower_case
    return expected_casing(pretrained.init_checkpoint) if pretrained.init_checkpoint else None


def resolve_lower_case(pretrained: Pretrained, asked: Optional[bool], allow_mismatch: bool = False) -> bool:
    """The casing of a fine-tuning run: `asked` (--do_lower_case) when given, checked against the checkpoint's
    (check_lower_case: one line when they disagree); None: the checkpoint's (recorded_lower_case), else True
    (the original's default)."""
    if asked is None:
        recorded = recorded_lower_case(pretrained)
        if recorded is None:
            return True
        logger.info("do_lower_case=%s: the casing %s records", recorded, pretrained.init_checkpoint)
        return recorded
    check_lower_case(pretrained, asked, allow_mismatch)
    return bool(asked)


def check_lower_case(pretrained: Pretrained, do_lower_case: bool, allow_mismatch: bool = False) -> None:
    """One clear error when --do_lower_case disagrees with what the checkpoint records or its name says."""
    if pretrained.do_lower_case is not None and pretrained.do_lower_case != bool(do_lower_case):
        msg = (f"do_lower_case={bool(do_lower_case)} but {pretrained.init_checkpoint} was trained with "
               f"do_lower_case={pretrained.do_lower_case}")
        if not allow_mismatch:
            raise ConfigError(msg + f"; pass --do_lower_case={pretrained.do_lower_case}")
        logger.warning(msg)
        return
    if pretrained.init_checkpoint:
        warning = check_casing(do_lower_case, pretrained.init_checkpoint, allow_mismatch=allow_mismatch)
        if warning:
            logger.warning(warning)


# ------------------------------------------------------------------ loading
# The pretraining heads: attribute of the pretrainer -> (what it is, its original TF1 name prefix).
PRETRAINING_HEADS = {"masked_lm": ("masked LM", "cls/predictions/"),
                     "next_sentence": ("next sentence", "cls/seq_relationship/")}


def fresh_pretraining_heads(model, path: str, fmt: str, report: Optional[checkpoints.LoadReport]) -> list:
    """The pretraining heads of `model` (PRETRAINING_HEADS keys) that the checkpoint at `path`, just
    loaded with `load_pretrained` (which returned `report`), did not hold: they keep their fresh values."""
    heads = [a for a in PRETRAINING_HEADS if getattr(model, a, None) is not None]
    if not heads:
        return []
    if report is not None:
        return [a for a in heads if any(n.startswith(PRETRAINING_HEADS[a][1]) for n in report.missing)]
    keys = checkpoints.variable_names(path)
    return [a for a in heads if not any(k.startswith(f"{checkpoints.CHECKPOINT_MODEL_KEY}/{a}/") for k in keys)]


def init_new_token_embeddings(model, vocab_file: str, init_checkpoint: str) -> list:
    """Starts the rows of an extended vocab's new tokens from the checkpoint's own rows.

    `vocab_file` extended by bert_tf.tokenization.vocab_builder.extend_vocab lists its new tokens
    and the old pieces each replaces (its extension JSON). For each new token the checkpoint was not
    trained with, the word-embedding row (and the masked-LM output bias, when the model has that
    head) becomes the mean of the rows of its old pieces. Whether the checkpoint knows a token is
    read from the vocab.txt beside it: the new token at its id (trained with it: left alone), the
    replaced [unused] token (initialised), anything else a CheckpointError; with no vocab.txt
    beside it the checkpoint is taken to hold the base vocab. Returns the ids initialised.
    """
    try:
        new_tokens = vocab_builder.read_extension(vocab_file)
    except InputDataError as e:
        raise CheckpointError(str(e)) from None
    if not new_tokens:
        return []
    beside = checkpoints.vocab_beside(init_checkpoint)
    known = {i: t for t, i in load_vocab(beside).items()} if beside else None
    todo = []
    for t in new_tokens:
        have = known.get(t.id) if known is not None else t.replaced
        if have == t.token:
            continue
        if have != t.replaced:
            raise CheckpointError(
                f"{vocab_file}: id {t.id} is {t.token!r} in place of {t.replaced!r}, but {beside} has {have!r} "
                "there; the vocab was extended from another vocab than the checkpoint's")
        todo.append(t)
    if not todo:
        return []
    targets = [checkpoints.encoder_of(model).embeddings.word_embeddings.embeddings]
    masked_lm = getattr(model, "masked_lm", None)
    if masked_lm is not None:
        targets.append(masked_lm.output_bias)
    for variable in targets:
        values = np.array(variable.numpy())
        for t in todo:
            values[t.id] = values[list(t.old_piece_ids)].mean(axis=0)
        variable.assign(values)
    return [t.id for t in todo]


@dataclasses.dataclass(frozen=True)
class StartingWeights:
    """What load_starting_weights did: `report` of a TF1 or Hugging Face load (None for ours),
    the pretraining heads that start fresh, and the new-token ids initialised."""

    fmt: str
    report: Optional[checkpoints.LoadReport]
    fresh_heads: List[str]
    new_token_ids: List[int]


def load_starting_weights(model, init_checkpoint: str, fmt: Optional[str] = None,
                          vocab_file: Optional[str] = None) -> StartingWeights:
    """Loads the checkpoint into a freshly built `model` by the rules every run starts with: the encoder
    must match completely; heads the checkpoint holds are loaded and the others start fresh; the rows
    of an extended vocab's new tokens start from their old pieces (init_new_token_embeddings)."""
    fmt = fmt or checkpoints.detect_format(init_checkpoint)
    report = checkpoints.load_pretrained(model, init_checkpoint, fmt)
    fresh = fresh_pretraining_heads(model, init_checkpoint, fmt, report)
    new_ids = init_new_token_embeddings(model, vocab_file, init_checkpoint) if vocab_file else []
    if new_ids:
        logger.info("%d new tokens of %s start from the mean embedding of their old wordpieces", len(new_ids),
                    vocab_file)
    return StartingWeights(fmt, report, fresh, new_ids)


# ------------------------------------------------------------------ for notebooks
def resolve(path: str, bert_config_file: Optional[str] = None, vocab_file: Optional[str] = None) -> Pretrained:
    """resolve_pretrained for a checkpoint that must exist (an empty path would mean "from scratch")."""
    if not path:
        raise ConfigError("from_pretrained needs a checkpoint path (an original, Hugging Face or bert_tf one)")
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, RELEASED_CHECKPOINT + ".index")):  # a released model's folder
        path = os.path.join(path, RELEASED_CHECKPOINT)
    return resolve_pretrained(path, bert_config_file, vocab_file)


def from_pretrained(model_class, path: str, *, bert_config_file: Optional[str] = None,
                    vocab_file: Optional[str] = None, **model_kwargs):
    """`model_class` (BertEncoder, or a task model built as model_class(encoder, **model_kwargs): num_labels,
    num_choices, skip_padding, name) on the encoder of the checkpoint at `path`, with its weights.

    bert_config_file / vocab_file: as the scripts' flags, for a checkpoint with none beside it. A
    checkpoint whose heads fit the model (a fine-tuned classifier's model dir and the same num_labels)
    loads them too; a head of another shape is a one-line CheckpointError.
    """
    pretrained = resolve(path, bert_config_file, vocab_file)
    encoder = pretrained.build_encoder()
    if issubclass(model_class, BertEncoder):
        if model_kwargs:
            raise TypeError(f"from_pretrained(BertEncoder, ...): unexpected argument(s) {', '.join(sorted(model_kwargs))}")
        model = encoder
    else:
        model = model_class(encoder, **model_kwargs)
    pretrained.init_fn(model)
    return model


class BertTokenizer:
    """Texts (and pairs) -> the encoder's input dict: int32 [N, S] `input_ids`, `input_mask`, `segment_ids`.

    vocab_file / do_lower_case: as FullTokenizer's. max_seq_length: S, the default of __call__.
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = True, max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH):
        _check_length(max_seq_length)
        self.vocab_file = vocab_file
        self.do_lower_case = bool(do_lower_case)
        self.max_seq_length = max_seq_length
        self.tokenizer = FastTokenizer(vocab_file, do_lower_case=self.do_lower_case)

    @classmethod
    def from_pretrained(cls, path: str, *, do_lower_case: Optional[bool] = None, max_seq_length: Optional[int] = None,
                        bert_config_file: Optional[str] = None, vocab_file: Optional[str] = None) -> "BertTokenizer":
        """The tokenizer of the checkpoint at `path` (see from_pretrained): its vocab, and its casing when it
        records one (bert_tf_info.json, a Hugging Face tokenizer_config.json, a released model's folder
        name), else `do_lower_case` (default True, the original's). A `do_lower_case` that disagrees with
        the record is a one-line error. max_seq_length: the model dir's, else DEFAULT_MAX_SEQ_LENGTH; at
        most the config's max_position_embeddings."""
        pretrained = resolve(path, bert_config_file, vocab_file)
        folder = pretrained.init_checkpoint if os.path.isdir(pretrained.init_checkpoint) else \
            os.path.dirname(pretrained.init_checkpoint)
        do_lower_case = resolve_lower_case(pretrained, do_lower_case)
        if max_seq_length is None:
            max_seq_length = min(read_run_info(folder).get("max_seq_length", DEFAULT_MAX_SEQ_LENGTH),
                                 pretrained.config.max_position_embeddings)
        elif max_seq_length > pretrained.config.max_position_embeddings:
            raise ConfigError(f"max_seq_length {max_seq_length} exceeds max_position_embeddings "
                                f"{pretrained.config.max_position_embeddings} of {path}")
        return cls(pretrained.vocab_file, do_lower_case, max_seq_length)

    def tokenize(self, text: str) -> list:
        """The word pieces of one text (FullTokenizer.tokenize)."""
        return self.tokenizer.tokenize(text)

    def __call__(self, texts: Union[str, Sequence[str]], pairs: Union[str, Sequence[str], None] = None, *,
                 max_seq_length: Optional[int] = None, return_tensors: str = "np") -> dict:
        """texts (N strings, or one) and optionally their N second segments -> {input_ids, input_mask,
        segment_ids}: int32 [N, S] numpy arrays ("np") or tf.Tensors ("tf"). For multiple choice, pass
        every (context, choice) pair and reshape each to [N, C, S]."""
        if return_tensors not in RETURN_TENSORS:
            raise ValueError(f"return_tensors {return_tensors!r}; expected one of {', '.join(RETURN_TENSORS)}")
        seq_length = self.max_seq_length if max_seq_length is None else max_seq_length
        _check_length(seq_length)
        texts = [texts] if isinstance(texts, (str, bytes)) else list(texts)
        if pairs is not None:
            pairs = [pairs] if isinstance(pairs, (str, bytes)) else list(pairs)
            if len(pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs; give one second segment per text")
        pieces_a = tokenize_all(self.tokenizer, texts)
        pieces_b = tokenize_all(self.tokenizer, pairs) if pairs is not None else [None] * len(texts)
        features = {name: np.zeros((len(texts), seq_length), np.int32)
                    for name in ("input_ids", "input_mask", "segment_ids")}
        for i, (a, b) in enumerate(zip(pieces_a, pieces_b, strict=True)):
            input_ids, segment_ids = pair_to_ids(self.tokenizer, a, b, seq_length)
            features["input_ids"][i, :len(input_ids)] = input_ids
            features["input_mask"][i, :len(input_ids)] = 1
            features["segment_ids"][i, :len(segment_ids)] = segment_ids
        if return_tensors == "tf":
            return {name: tf.constant(value) for name, value in features.items()}
        return features


def _check_length(max_seq_length: int) -> None:
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3 ([CLS] A [SEP] B [SEP] needs it), got {max_seq_length}")
