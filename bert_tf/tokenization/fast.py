"""Fast batch tokenizer with exactly `FullTokenizer`'s output (docs/reference.md §5).

Why this is exact: after cleaning, every rule of the original works inside one
whitespace-delimited word (lower-casing, NFD, dropping Mn, punctuation
splitting, WordPiece), and the spaces put around CJK ideographs only cut words
further. So a text's wordpieces are the concatenation of the wordpieces of its
raw "chunks" - maximal runs of characters that are neither a word separator
nor a CJK ideograph - each tokenized on its own by the original rules.

Why this is fast: chunks are cut by C code (`str.split` for ASCII texts, one
compiled regex otherwise); a chunk's words, wordpieces and ids are computed
once and then looked up in a dict. Natural text repeats its chunks (Zipf), so
almost every chunk is a dict hit and the per-text loop runs in C (`map` +
`chain`). A miss costs a few C string operations: ASCII chunks need only
`lower()` and a punctuation regex; other chunks use regexes built from the
original's own predicates (`full.is_control`, `full.is_punctuation`, Mn) and
`unicodedata`, then WordPiece. tests/test_fast_tokenizer.py checks the result
against `FullTokenizer` on ~90,000 code points in context, every ASCII pair
and real multilingual text.

Compiled ops were measured (benchmarks/bench_tokenizers.py) and are not
exact: Hugging Face `tokenizers` (slower than this once output is Python
lists) differs on final sigma, private-use characters and words of 101-200
characters; tensorflow-text's FastBertTokenizer (about as fast as a warm
cache) also folds compatibility characters ("…" -> "...", "ß" -> "ss")
and treats NUL and \x0b differently.

Separators: a character splits words in the original iff it survives cleaning
and is whitespace to `str.split`: " \\t\\n\\r", category Zs, and U+2028/U+2029
(which are not Zs but survive cleaning, so `split()` cuts on them). The
opposite trap: \\x0b \\x0c \\x1c-\\x1f \\x85 are whitespace to `str.split` but
control characters the original deletes, so "a\\x0bb" is one word "ab"; they
are removed before splitting.
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from typing import Callable, Iterable, List, Optional, Tuple, Union

from bert_tf.tokenization.full import (
    CJK_RANGES,
    BasicTokenizer,
    WordpieceTokenizer,
    convert_to_unicode,
    is_control,
    is_punctuation,
    load_vocab,
)

# Chunks (or words) remembered per cache (there are four) before that cache
# is emptied and refilled; ~250 bytes each, so at most ~250 MB in all.
# Memory and speed only: never changes results.
DEFAULT_CACHE_SIZE = 1 << 18

# Characters that `str.split()` / regex `\s` treat as whitespace (all are below U+3001).
_PY_SPACES = [chr(cp) for cp in range(0x3001) if chr(cp).isspace()]
# ... of which the original's cleaning deletes these (control characters),
# so they must not separate words.
_DROPPED_SPACES = "".join(c for c in _PY_SPACES if BasicTokenizer._clean_text(c) == "")
assert not any(c.isprintable() for c in _DROPPED_SPACES)  # _chunks relies on it
_DROPPED_SPACES_RE = re.compile("[" + re.escape(_DROPPED_SPACES) + "]")
_ASCII_DROPPED_SPACES_RE = re.compile("[" + re.escape("".join(c for c in _DROPPED_SPACES if c.isascii())) + "]")
_CJK_CLASS = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in CJK_RANGES)
# A chunk: a run of non-separator, non-CJK characters, or one CJK ideograph.
_CHUNK_RE = re.compile(rf"[^\s{_CJK_CLASS}]+|[{_CJK_CLASS}]")

# ASCII chunks: the original's rules reduce to deleting control characters,
# str.lower() and cutting at ASCII punctuation (NFD leaves ASCII unchanged).
_ASCII_DELETE = {cp: None for cp in range(128) if cp == 0 or is_control(chr(cp))}
_ASCII_PUNCT = re.escape("".join(chr(cp) for cp in range(128) if is_punctuation(chr(cp))))
_ASCII_WORD_RE = re.compile(f"[^{_ASCII_PUNCT}]+|[{_ASCII_PUNCT}]")


def _ranges_class(code_points: List[int]) -> str:
    """A regex character class body for sorted `code_points`, as ranges."""
    ranges: List[List[int]] = []
    for cp in code_points:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "".join(re.escape(chr(lo)) + ("-" + re.escape(chr(hi)) if hi > lo else "") for lo, hi in ranges)


@functools.lru_cache(maxsize=None)
def _unicode_tables() -> Tuple[re.Pattern, re.Pattern, re.Pattern]:
    """(deleted-by-cleaning, Mn, word-or-punctuation) regexes from Python's unicodedata.

    Built on first use (~0.5 s) with the original's own predicates, so they
    follow the running Python's Unicode version exactly as it does. The
    category test in front only skips code points those predicates reject.
    """
    delete, marks, punct = [], [], []
    category = unicodedata.category
    for cp in range(0x110000):
        char = chr(cp)
        cat = category(char)
        if (cat in ("Cc", "Cf") and is_control(char)) or cp in (0, 0xFFFD):
            delete.append(cp)
        elif cat == "Mn":
            marks.append(cp)
        if (cp < 128 or cat[0] == "P") and is_punctuation(char):
            punct.append(cp)
    punct_class = _ranges_class(punct)
    return (re.compile(f"[{_ranges_class(delete)}]"), re.compile(f"[{_ranges_class(marks)}]+"),
            re.compile(f"[^{punct_class}]+|[{punct_class}]"))


def _chunks(text: Union[str, bytes]) -> List[str]:
    """The raw chunks of one text, in order (see the module docstring)."""
    if not isinstance(text, str):
        text = convert_to_unicode(text)
    # isprintable() (a fast C scan) is False for every character that needs
    # removing here (all are category Cc), so it spares most texts the regex.
    if text.isascii():  # O(1) for str: a flag CPython keeps
        if not text.isprintable() and _ASCII_DROPPED_SPACES_RE.search(text) is not None:
            text = _ASCII_DROPPED_SPACES_RE.sub("", text)
        return text.split()
    if not text.isprintable() and _DROPPED_SPACES_RE.search(text) is not None:
        text = _DROPPED_SPACES_RE.sub("", text)
    return _CHUNK_RE.findall(text)


class _ChunkCache(dict):
    """chunk -> tuple, computed on first use; emptied when it reaches `max_size`."""

    def __init__(self, compute: Callable[[str], Tuple], max_size: int):
        super().__init__()
        self._compute = compute
        self._max_size = max_size

    def __missing__(self, chunk: str) -> Tuple:
        value = self._compute(chunk)
        if len(self) >= self._max_size:
            self.clear()
        self[chunk] = value
        return value


class FastTokenizer:
    """Batch tokenizer giving exactly `FullTokenizer`'s wordpieces and ids.

    Args:
      vocab_file: one token per line, id = line number.
      do_lower_case: lower-case the text (and, by default, strip accents).
      strip_accents: drop combining marks after NFD. None follows
        `do_lower_case` as the original; False with `do_lower_case=True`
        lower-cases but keeps accents and Hangul syllables whole.
      cache_size: chunks remembered per cache; memory only, never results.
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = True, strip_accents: Optional[bool] = None,
                 cache_size: int = DEFAULT_CACHE_SIZE):
        self.vocab = load_vocab(vocab_file)
        self.inv_vocab = {v: k for k, v in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case, strip_accents=strip_accents)
        self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)
        self._longest_entry = max(map(len, self.vocab))
        self._cache_size = cache_size
        self._new_caches()

    def _new_caches(self) -> None:
        size = self._cache_size
        self._words = _ChunkCache(self._chunk_words, size)  # chunk -> BasicTokenizer words
        self._word_pieces = _ChunkCache(self._word_to_pieces, size)  # word -> wordpieces
        self._pieces = _ChunkCache(self._chunk_pieces, size)  # chunk -> wordpieces
        self._ids = _ChunkCache(self._chunk_ids, size)  # chunk -> ids

    def __getstate__(self) -> dict:
        # Send the rules and the vocab to worker processes, not the caches.
        state = dict(self.__dict__)
        for name in ("_words", "_word_pieces", "_pieces", "_ids"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._new_caches()

    def _chunk_words(self, chunk: str) -> Tuple[str, ...]:
        """BasicTokenizer words of one chunk (no separators inside; CJK ideographs alone)."""
        lower = self.basic_tokenizer.do_lower_case
        if chunk.isascii():
            if not chunk.isprintable():  # has an ASCII control character
                chunk = chunk.translate(_ASCII_DELETE)
            return tuple(_ASCII_WORD_RE.findall(chunk.lower() if lower else chunk))
        delete_re, marks_re, word_re = _unicode_tables()
        chunk = delete_re.sub("", chunk)
        if lower:
            # On the whole chunk, as the original: str.lower() looks at
            # neighbours for a final sigma.
            chunk = chunk.lower()
        if self.basic_tokenizer.strip_accents:
            chunk = marks_re.sub("", unicodedata.normalize("NFD", chunk))
        return tuple(word_re.findall(chunk))

    def _word_to_pieces(self, word: str) -> Tuple[str, ...]:
        """WordPiece of one word: `WordpieceTokenizer.tokenize_word`, but never
        trying a candidate longer than the longest vocab entry (it cannot
        match), which makes long words (Thai, kana runs) linear, not quadratic."""
        wordpiece = self.wordpiece_tokenizer
        if len(word) > wordpiece.max_input_chars_per_word:
            return (wordpiece.unk_token,)
        vocab, longest = self.vocab, self._longest_entry
        pieces = []
        start = 0
        while start < len(word):
            end = min(len(word), start + longest)
            while start < end:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    break
                end -= 1
            else:  # one unmatched position makes the whole word unknown
                return (wordpiece.unk_token,)
            pieces.append(piece)
            start = end
        return tuple(pieces)

    def _chunk_pieces(self, chunk: str) -> Tuple[str, ...]:
        word_pieces = self._word_pieces
        return tuple([piece for word in self._words[chunk] for piece in word_pieces[word]])

    def _chunk_ids(self, chunk: str) -> Tuple[int, ...]:
        vocab = self.vocab
        return tuple([vocab[piece] for piece in self._pieces[chunk]])

    @staticmethod
    def _run(cache: _ChunkCache, texts: Iterable[Union[str, bytes]]) -> List[list]:
        if isinstance(texts, (str, bytes)):
            raise TypeError("expected a list of texts, got a single text; use tokenize() for one")
        lookup = cache.__getitem__
        chain = itertools.chain.from_iterable
        return [list(chain(map(lookup, _chunks(text)))) for text in texts]

    def tokenize_batch(self, texts: Iterable[Union[str, bytes]]) -> List[List[str]]:
        """Wordpieces of each text, as `FullTokenizer.tokenize`."""
        return self._run(self._pieces, texts)

    def encode_batch(self, texts: Iterable[Union[str, bytes]]) -> List[List[int]]:
        """Vocab ids of each text's wordpieces."""
        return self._run(self._ids, texts)

    def basic_tokenize_batch(self, texts: Iterable[Union[str, bytes]]) -> List[List[str]]:
        """Words after the BasicTokenizer rules, before WordPiece."""
        return self._run(self._words, texts)

    def word_ids(self, words: Iterable[str]) -> List[List[int]]:
        """Vocab ids of the wordpieces of each word (words as `basic_tokenize_batch` returns them)."""
        vocab, pieces = self.vocab, self._word_pieces
        return [[vocab[piece] for piece in pieces[word]] for word in words]

    def tokenize(self, text: Union[str, bytes]) -> List[str]:
        return self.tokenize_batch([text])[0]

    # The rest of FullTokenizer's interface, so either can be passed around.
    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> List[int]:
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> List[str]:
        return [self.inv_vocab[i] for i in ids]
