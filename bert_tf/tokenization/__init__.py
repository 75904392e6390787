"""Tokenizers: the original's exact `FullTokenizer`, a fast batch path, and a vocab builder."""

from bert_tf.tokenization.fast import FastTokenizer  # noqa: F401, E402
from bert_tf.tokenization.full import (  # noqa: F401
    SPECIAL_TOKENS,
    BasicTokenizer,
    FullTokenizer,
    VocabError,  # the old name of bert_tf.errors.InputDataError, kept importable
    WordpieceTokenizer,
    check_special_tokens,
    check_vocab_fits,
    convert_to_unicode,
    load_vocab,
)
