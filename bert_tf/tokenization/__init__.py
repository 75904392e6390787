"""Tokenizers: the original's exact `FullTokenizer`, a fast batch path, and a vocab builder."""

from bert_tf.tokenization.full import (  # noqa: F401
    SPECIAL_TOKENS,
    BasicTokenizer,
    FullTokenizer,
    VocabError,
    WordpieceTokenizer,
    check_special_tokens,
    convert_to_unicode,
    load_vocab,
)


def __getattr__(name):
    # The fast path imports tensorflow-text; load it only when asked for.
    if name == "FastTokenizer":
        from bert_tf.tokenization.fast import FastTokenizer

        return FastTokenizer
    raise AttributeError(name)
