"""A pretrained model and its tokenizer in one call each, for notebooks: the Python path to what the
fine-tuning scripts do with --init_checkpoint.

    from bert_tf.models import BertClassifier, BertEncoder
    from bert_tf.pretrained import BertTokenizer

    model = BertClassifier.from_pretrained(path, num_labels=3)    # or BertEncoder.from_pretrained(path)
    tokenizer = BertTokenizer.from_pretrained(path)
    logits = model(tokenizer(["The cat sat.", "A dog ran."], ["It sat.", "It ran."]))  # [2, 3]

`path` is what the scripts' --init_checkpoint takes: an original TF1 checkpoint
(`.../bert_model.ckpt`, or its folder), a Hugging Face folder or `.safetensors`
file, or a bert_tf model dir (its latest checkpoint). The script path is reused,
not repeated: bert_tf.finetuning.resolve_pretrained finds the config, vocab,
casing, format and causal attention beside the checkpoint, and Pretrained.init_fn
loads the weights (the encoder must match completely; heads the checkpoint has
are loaded, the others start fresh). Errors are one line (FinetuneError,
CheckpointError, ConfigError: all ValueError).

The tokenizer is named as Hugging Face's, whose role it plays: strings (and
pairs) -> the model's input dict, `[CLS] A [SEP] (B [SEP])` with the pair
truncated as the original (truncate_seq_pair), zero-padded to max_seq_length;
its word pieces are FullTokenizer's (through FastTokenizer), cased as the
checkpoint records.

Dimensions: N texts, S max_seq_length.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import numpy as np

from bert_tf.configs import expected_casing, read_run_info
from bert_tf.finetuning import FinetuneError, Pretrained, check_lower_case, resolve_pretrained
from bert_tf.tasks.glue import pair_to_ids, tokenize_all
from bert_tf.tokenization.fast import FastTokenizer

# The fine-tuning scripts' default --max_seq_length, used when the checkpoint records none.
DEFAULT_MAX_SEQ_LENGTH = 128
RETURN_TENSORS = ("np", "tf")
# The checkpoint prefix in the original's released folders (uncased_L-12_H-768_A-12/bert_model.ckpt).
RELEASED_CHECKPOINT = "bert_model.ckpt"


def resolve(path: str, bert_config_file: Optional[str] = None, vocab_file: Optional[str] = None) -> Pretrained:
    """resolve_pretrained for a checkpoint that must exist (an empty path would mean "from scratch")."""
    if not path:
        raise FinetuneError("from_pretrained needs a checkpoint path (an original, Hugging Face or bert_tf one)")
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
    from bert_tf.models.encoder import BertEncoder

    pretrained = resolve(path, bert_config_file, vocab_file)
    encoder = pretrained.build_encoder()
    if issubclass(model_class, BertEncoder):
        if model_kwargs:
            raise TypeError(f"BertEncoder.from_pretrained: unexpected argument(s) {', '.join(sorted(model_kwargs))}")
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
        if do_lower_case is None:
            recorded = pretrained.do_lower_case
            if recorded is None:
                recorded = expected_casing(pretrained.init_checkpoint)
            do_lower_case = True if recorded is None else recorded
        else:
            check_lower_case(pretrained, do_lower_case)
        if max_seq_length is None:
            max_seq_length = min(read_run_info(folder).get("max_seq_length", DEFAULT_MAX_SEQ_LENGTH),
                                 pretrained.config.max_position_embeddings)
        elif max_seq_length > pretrained.config.max_position_embeddings:
            raise FinetuneError(f"max_seq_length {max_seq_length} exceeds max_position_embeddings "
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
            import tensorflow as tf

            return {name: tf.constant(value) for name, value in features.items()}
        return features


def _check_length(max_seq_length: int) -> None:
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3 ([CLS] A [SEP] B [SEP] needs it), got {max_seq_length}")
