"""The original BERT tokenizer, rule for rule (docs/reference.md §5).

`FullTokenizer` = `BasicTokenizer` (clean, split CJK, lower-case/strip accents,
split punctuation) then `WordpieceTokenizer` (greedy longest-match-first).
Every checkpoint ever released was trained on ids made by these rules, so they
are reproduced to the character, quirks included: lower-casing and accent
stripping come together (which also decomposes Hangul syllables into Jamo),
and `$ + < = > ^ ` | ~` count as punctuation although Unicode says "symbol".

Beyond the original: `strip_accents=False` lower-cases but keeps accents (and
Hangul syllables) whole. It is off by default.
"""

from __future__ import annotations

import collections
import unicodedata
from typing import Dict, Iterable, List, Optional, Union

from bert_tf import fileio
from bert_tf.errors import InputDataError

# Words longer than this become [UNK] in WordPiece (the original's
# `max_input_chars_per_word`).
MAX_CHARS_PER_WORD = 200
UNK_TOKEN = "[UNK]"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# CJK Unified Ideographs and extensions, compatibility ideographs (docs/reference.md §5).
# Hangul, Hiragana and Katakana are deliberately absent, as in the original.
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


VocabError = InputDataError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


def convert_to_unicode(text: Union[str, bytes]) -> str:
    """Text as `str`; bytes are decoded as UTF-8 with undecodable bytes dropped."""
    if isinstance(text, str):
        return text
    if isinstance(text, bytes):
        return text.decode("utf-8", "ignore")
    raise TypeError(f"expected str or bytes, got {type(text).__name__}")


def load_vocab(vocab_file: str) -> "collections.OrderedDict[str, int]":
    """Token -> id, id = line number; lines are stripped as in the original."""
    if not fileio.exists(vocab_file):
        raise InputDataError(f"{vocab_file}: vocab file not found")
    vocab: "collections.OrderedDict[str, int]" = collections.OrderedDict()
    with fileio.open_file(vocab_file, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputDataError(f"{vocab_file}: not UTF-8 text (byte {e.start})") from None
    # The original reads with readline(), which splits on "\n" only.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for index, line in enumerate(lines):
        vocab[line.strip()] = index
    if not vocab:
        raise InputDataError(f"{vocab_file}: vocab file is empty")
    return vocab


def whitespace_tokenize(text: str) -> List[str]:
    return text.strip().split()


def is_whitespace(char: str) -> bool:
    # \t, \n and \r are control characters by category but whitespace here.
    if char in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(char) == "Zs"


def is_control(char: str) -> bool:
    if char in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def is_punctuation(char: str) -> bool:
    cp = ord(char)
    # ASCII non-letter/number characters are all punctuation here, including
    # symbols such as "^", "$" and "`" that Unicode puts in category S.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES)


class BasicTokenizer:
    """Cleaning, CJK splitting, casing and punctuation splitting.

    Args:
      do_lower_case: lower-case the text.
      strip_accents: drop combining marks after NFD. None (default) follows
        `do_lower_case`, as the original; False keeps accents while lower-casing.
    """

    def __init__(self, do_lower_case: bool = True, strip_accents: Optional[bool] = None):
        self.do_lower_case = do_lower_case
        self.strip_accents = do_lower_case if strip_accents is None else strip_accents

    def tokenize(self, text: Union[str, bytes]) -> List[str]:
        text = convert_to_unicode(text)
        text = self._clean_text(text)
        # Spaces around CJK ideographs: multilingual and Chinese models were
        # trained this way (the original, from November 2018 on).
        text = self._tokenize_chinese_chars(text)
        output = []
        for token in whitespace_tokenize(text):
            if self.do_lower_case:
                token = token.lower()
            if self.strip_accents:
                token = self._run_strip_accents(token)
            output.extend(self._run_split_on_punc(token))
        return whitespace_tokenize(" ".join(output))

    @staticmethod
    def _run_strip_accents(text: str) -> str:
        text = unicodedata.normalize("NFD", text)
        return "".join(c for c in text if unicodedata.category(c) != "Mn")

    @staticmethod
    def _run_split_on_punc(text: str) -> List[str]:
        output: List[List[str]] = []
        start_new_word = True
        for char in text:
            if is_punctuation(char):
                output.append([char])
                start_new_word = True
            else:
                if start_new_word:
                    output.append([])
                start_new_word = False
                output[-1].append(char)
        return ["".join(x) for x in output]

    @staticmethod
    def _tokenize_chinese_chars(text: str) -> str:
        out = []
        for char in text:
            if is_cjk(ord(char)):
                out.extend((" ", char, " "))
            else:
                out.append(char)
        return "".join(out)

    @staticmethod
    def _clean_text(text: str) -> str:
        out = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or is_control(char):
                continue
            out.append(" " if is_whitespace(char) else char)
        return "".join(out)


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece over an already basic-tokenized text."""

    def __init__(self, vocab: Dict[str, int], unk_token: str = UNK_TOKEN,
                 max_input_chars_per_word: int = MAX_CHARS_PER_WORD):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text: Union[str, bytes]) -> List[str]:
        output: List[str] = []
        for token in whitespace_tokenize(convert_to_unicode(text)):
            output.extend(self.tokenize_word(token))
        return output

    def tokenize_word(self, word: str) -> List[str]:
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces = []
        start = 0
        while start < len(word):
            end = len(word)
            piece = None
            while start < end:
                candidate = word[start:end]
                if start > 0:
                    candidate = "##" + candidate
                if candidate in self.vocab:
                    piece = candidate
                    break
                end -= 1
            if piece is None:
                # One unmatched position makes the whole word unknown.
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces


class FullTokenizer:
    """The original end-to-end tokenizer: `tokenize`, ids <-> tokens, `vocab`, `inv_vocab`."""

    def __init__(self, vocab_file: str, do_lower_case: bool = True, strip_accents: Optional[bool] = None):
        self.vocab = load_vocab(vocab_file)
        self.inv_vocab = {v: k for k, v in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case, strip_accents=strip_accents)
        self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)

    def tokenize(self, text: Union[str, bytes]) -> List[str]:
        pieces: List[str] = []
        for token in self.basic_tokenizer.tokenize(text):
            pieces.extend(self.wordpiece_tokenizer.tokenize_word(token))
        return pieces

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> List[int]:
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> List[str]:
        return [self.inv_vocab[i] for i in ids]

    # Batch interface shared with FastTokenizer, so bulk code can take either.
    def tokenize_batch(self, texts: Iterable[Union[str, bytes]]) -> List[List[str]]:
        return [self.tokenize(t) for t in texts]

    def encode_batch(self, texts: Iterable[Union[str, bytes]]) -> List[List[int]]:
        return [self.convert_tokens_to_ids(self.tokenize(t)) for t in texts]

    def basic_tokenize_batch(self, texts: Iterable[Union[str, bytes]]) -> List[List[str]]:
        return [self.basic_tokenizer.tokenize(t) for t in texts]


def check_special_tokens(vocab: Dict[str, int], vocab_file: str, required=SPECIAL_TOKENS[1:]) -> None:
    """One clear error when a vocab lacks a token the pipeline needs."""
    missing = [t for t in required if t not in vocab]
    if missing:
        raise InputDataError(f"{vocab_file}: vocab has no {', '.join(missing)} token")


def check_vocab_fits(vocab_file: str, vocab_size: int, checkpoint: Optional[str] = None) -> int:
    """One clear error when `vocab_file` does not belong to a model with `vocab_size` embedding rows.

    Every id the vocab makes (its special tokens among them) must have a row. With a `checkpoint`
    the vocab must be exactly the checkpoint's size: fewer entries than its embeddings is another
    model's vocab (a domain vocab, a cased one for an uncased model), which would train and run
    without any error while every id means something else. An extension of the checkpoint's vocab
    (create_vocab.py --extend_vocab) keeps its size. Returns the vocab's size.
    """
    size = len(load_vocab(vocab_file))
    if checkpoint and size != vocab_size:
        raise InputDataError(
            f"{vocab_file}: {size} tokens but {checkpoint} has vocab_size {vocab_size}; use the checkpoint's "
            "vocab (or an extension of it: create_vocab.py --extend_vocab)")
    if size > vocab_size:
        raise InputDataError(
            f"{vocab_file}: {size} tokens but the model's vocab_size is {vocab_size}; this vocab does not "
            "belong to this model")
    return size
