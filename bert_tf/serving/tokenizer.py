"""In-graph BERT tokenization with tensorflow-text, matching `FullTokenizer` (docs/reference.md §5).

Dimensions: B batch, W words, P pieces per word, T wordpieces of a text, S max_seq_length.

The rules are the original's, run as string ops on the whole batch:
  clean (drop NUL, U+FFFD and Cc/Cf except \\t\\n\\r; whitespace -> " ")
  -> spaces around CJK ideographs -> lower-case -> NFD, drop Mn
  -> split on spaces, punctuation kept as its own word -> WordPiece.
Doing lower-casing and NFD on the whole text instead of word by word is the
same thing: neither looks across a space (Final_Sigma context stops there).

Why it matches `FullTokenizer` character for character:
- The character classes (control, whitespace, punctuation, Mn) are not the
  regex engine's `\\p{...}` (RE2's Unicode tables are another version); they are
  enumerated from the exporting Python's `unicodedata` by the very predicates
  `FullTokenizer` uses, and written into the graph as explicit code-point ranges.
- Lower-casing (`tf.strings.lower`, TensorFlow's ICU) and NFD
  (`tensorflow_text.normalize_utf8`, tf-text's ICU) follow other Unicode versions
  than Python's. At export time every code point is run through both and
  compared with Python; the few that differ (characters added in later Unicode
  versions) are patched: lower-casing gets Python's result substituted first,
  and characters that ICU would decompose but Python does not are hidden behind
  control characters (already removed by cleaning) during NFD and restored after.
  `unicode_differences()` reports what was patched.
- Words longer than MAX_CHARS_PER_WORD characters become [UNK] by a character
  count in the graph (tf-text's WordPiece limit counts bytes).
What can still differ: the exported graph is exact for the ICU inside the
tensorflow / tensorflow-text that exported it; serving with other versions can
only change characters whose casing or decomposition changed between Unicode
versions. Invalid UTF-8 is dropped (Python drops it too; the split of an invalid
run into dropped bytes could in principle differ).
"""

from __future__ import annotations

import functools
import unicodedata
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from bert_tf.tokenization.full import (
    CJK_RANGES,
    MAX_CHARS_PER_WORD,
    UNK_TOKEN,
    BasicTokenizer,
    is_control,
    is_punctuation,
)

_ALL_CODE_POINTS = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
# Stand-ins used while NFD runs: control characters, which cleaning has already
# removed from the text (so they cannot collide) and which NFD leaves alone.
_PLACEHOLDERS = [chr(cp) for cp in [*range(0x01, 0x09), *range(0x0E, 0x20), *range(0x7F, 0xA0)]]


def _ranges(code_points: Sequence[int]) -> List[Tuple[int, int]]:
    out: List[List[int]] = []
    for cp in sorted(code_points):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return [(lo, hi) for lo, hi in out]


def _re2_class(code_points: Sequence[int]) -> str:
    """An RE2 character class listing exactly these code points."""
    body = "".join(
        f"\\x{{{lo:x}}}" if lo == hi else f"\\x{{{lo:x}}}-\\x{{{hi:x}}}" for lo, hi in _ranges(code_points)
    )
    return f"[{body}]"


@functools.lru_cache(maxsize=None)
def character_classes() -> Dict[str, str]:
    """RE2 classes from this Python's unicodedata, by FullTokenizer's own predicates.

    deleted: removed by cleaning; space: becomes a word separator after cleaning
    (" ", \\t\\n\\r, Zs, and what `str.split()` also cuts at: U+2028/U+2029, ...);
    punct: split off as its own word; mark: category Mn (dropped after NFD).
    """
    deleted, space, punct, mark = [], [], [], []
    for cp in _ALL_CODE_POINTS:
        char = chr(cp)
        category = unicodedata.category(char)
        if category in ("Cn", "Co"):  # unassigned, private use: none of the classes (fast path)
            continue
        if cp == 0 or cp == 0xFFFD or is_control(char):
            deleted.append(cp)
            continue
        if category == "Zs" or char.isspace() or BasicTokenizer._clean_text(char) == " ":
            space.append(cp)
        if is_punctuation(char):
            punct.append(cp)
        if category == "Mn":
            mark.append(cp)
    cjk = [cp for lo, hi in CJK_RANGES for cp in range(lo, hi + 1)]
    return {
        "deleted": _re2_class(deleted),
        "space": _re2_class(space),
        "punct": _re2_class(punct),
        "mark": _re2_class(mark),
        "cjk": _re2_class(cjk),
    }


@functools.lru_cache(maxsize=None)
def unicode_differences() -> Dict[str, Dict[str, str]]:
    """Code points where this TensorFlow's ICU disagrees with Python's unicodedata.

    Returns {"lower": {char: python_lower}, "nfd": {char: python_nfd}} for
    characters that survive cleaning. Runs every code point through the graph
    ops once (~2 s).
    """
    import tensorflow_text as tf_text

    # Private-use characters have no case or decomposition in any Unicode version.
    chars = [chr(cp) for cp in _ALL_CODE_POINTS
             if cp not in (0, 0xFFFD) and unicodedata.category(chr(cp)) not in ("Co", "Cc", "Cf")]
    encoded = tf.constant([c.encode("utf-8") for c in chars])
    icu_lower = tf.strings.lower(encoded, encoding="utf-8").numpy()
    icu_nfd = tf_text.normalize_utf8(encoded, "NFD").numpy()
    lower, nfd = {}, {}
    for char, low, dec in zip(chars, icu_lower, icu_nfd, strict=True):
        if char.lower() != low.decode("utf-8"):
            lower[char] = char.lower()
        py_nfd = unicodedata.normalize("NFD", char)
        if py_nfd != dec.decode("utf-8"):
            nfd[char] = py_nfd
    if len(nfd) > len(_PLACEHOLDERS):
        raise RuntimeError(f"{len(nfd)} NFD differences between ICU and Python; at most {len(_PLACEHOLDERS)} patchable")
    return {"lower": lower, "nfd": nfd}


def _literal(char: str) -> str:
    return f"\\x{{{ord(char):x}}}"


class InGraphTokenizer(tf.Module):
    """Raw UTF-8 strings -> wordpiece ids, inside the graph (no Python at serving time).

    Args:
      vocab_file: a vocab.txt; stored as a `tf.saved_model.Asset` so the
        SavedModel carries it. Lines are stripped as the original does.
      do_lower_case, strip_accents: as `FullTokenizer` (strip_accents None
        follows do_lower_case).
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = True, strip_accents=None, name=None):
        super().__init__(name=name)
        self.vocab_file = tf.saved_model.Asset(vocab_file)
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = self.do_lower_case if strip_accents is None else bool(strip_accents)
        self._classes = character_classes()
        diffs = unicode_differences()
        self._lower_patches = sorted(diffs["lower"].items()) if self.do_lower_case else []
        self._nfd_patches = sorted(diffs["nfd"].items()) if self.strip_accents else []
        self.vocab_table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(
                self.vocab_file, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER),
            default_value=-1, experimental_is_anonymous=True)
        self.id_to_token = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(
                self.vocab_file, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
                tf.string, tf.lookup.TextFileIndex.WHOLE_LINE),
            default_value=UNK_TOKEN, experimental_is_anonymous=True)

    # ------------------------------------------------------------------ stages
    @staticmethod
    def _patched(text, patches, check_class):
        """Applies literal replacements, but only when the batch holds one of the characters."""
        def apply():
            out = text
            for char, replacement in patches:
                out = tf.strings.regex_replace(out, _literal(char), replacement)
            return out

        needed = tf.reduce_any(tf.strings.regex_full_match(text, f"(?s).*{check_class}.*"))
        return tf.cond(needed, apply, lambda: text)

    def normalize(self, text: tf.Tensor) -> tf.Tensor:
        """string [B] -> string [B]: cleaned, CJK spaced, cased and accent-stripped as configured."""
        import tensorflow_text as tf_text

        c = self._classes
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="ignore")
        text = tf.strings.regex_replace(text, c["deleted"], "")
        text = tf.strings.regex_replace(text, c["space"], " ")
        text = tf.strings.regex_replace(text, f"({c['cjk']})", r" \1 ")
        if self.do_lower_case:
            if self._lower_patches:
                text = self._patched(text, self._lower_patches,
                                     _re2_class([ord(k) for k, _ in self._lower_patches]))
            text = tf.strings.lower(text, encoding="utf-8")
        if self.strip_accents:
            if self._nfd_patches:
                hide = [(char, _PLACEHOLDERS[i]) for i, (char, _) in enumerate(self._nfd_patches)]
                text = self._patched(text, hide, _re2_class([ord(k) for k, _ in hide]))
            text = tf_text.normalize_utf8(text, "NFD")
            if self._nfd_patches:
                show = [(_PLACEHOLDERS[i], nfd) for i, (_, nfd) in enumerate(self._nfd_patches)]
                text = self._patched(text, show, _re2_class([ord(p) for p, _ in show]))
            text = tf.strings.regex_replace(text, c["mark"], "")
        return text

    def words(self, text: tf.Tensor) -> tf.RaggedTensor:
        """string [B] -> string [B, (W)]: the BasicTokenizer words."""
        import tensorflow_text as tf_text

        c = self._classes
        normalized = self.normalize(text)
        return tf_text.regex_split(normalized, f" +|{c['punct']}", c["punct"])

    def wordpieces(self, words: tf.RaggedTensor) -> tf.RaggedTensor:
        """string [B, (W)] -> int64 ids [B, (W), (P)]; greedy longest-match-first WordPiece."""
        import tensorflow_text as tf_text

        # Over-long words become [UNK] by character count, as the original;
        # tf-text's own limit counts bytes, so it is set beyond any 200-char word.
        too_long = tf.strings.length(words, unit="UTF8_CHAR") > MAX_CHARS_PER_WORD
        words = tf.ragged.map_flat_values(lambda w, t: tf.where(t, UNK_TOKEN, w), words, too_long)
        wordpiece = tf_text.WordpieceTokenizer(
            self.vocab_table, suffix_indicator="##", max_bytes_per_word=4 * MAX_CHARS_PER_WORD,
            token_out_type=tf.int64, unknown_token=UNK_TOKEN)
        return wordpiece.tokenize(words)

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        """string [B] -> int64 ids [B, (T)], the same as FullTokenizer.tokenize + convert_tokens_to_ids."""
        return self.wordpieces(self.words(text)).merge_dims(-2, -1)

    def lookup(self, token: str) -> tf.Tensor:
        return self.vocab_table.lookup(tf.constant(token))


# ------------------------------------------------------------------ packing
def truncated_pair_lengths(len_a: tf.Tensor, len_b: tf.Tensor, budget) -> Tuple[tf.Tensor, tf.Tensor]:
    """Lengths after the original's `_truncate_seq_pair` (longest first, ties cut B), int [B] each.

    The original pops one token at a time from the longer of A and B (from B
    when equal) until len_a + len_b <= budget; in closed form: a side no longer
    than half the budget is kept whole and the other gets the rest, otherwise A
    keeps ceil(budget / 2) and B floor(budget / 2).
    """
    len_a = tf.cast(len_a, tf.int64)
    len_b = tf.cast(len_b, tf.int64)
    budget = tf.cast(budget, tf.int64)
    fits = len_a + len_b <= budget
    new_a = tf.where(2 * len_b <= budget, budget - len_b,
                     tf.where(2 * len_a <= budget, len_a, (budget + 1) // 2))
    new_b = tf.where(2 * len_b <= budget, len_b,
                     tf.where(2 * len_a <= budget, budget - len_a, budget // 2))
    return tf.where(fits, len_a, new_a), tf.where(fits, len_b, new_b)


def pack_pair(ids_a: tf.RaggedTensor, ids_b: tf.RaggedTensor, seq_length: int, cls_id, sep_id,
              len_a: Optional[tf.Tensor] = None, len_b: Optional[tf.Tensor] = None) -> Dict[str, tf.Tensor]:
    """[CLS] A [SEP] (B [SEP]) padded to seq_length, as the original's convert_single_example.

    ids_a, ids_b: int64 [B, (T)]; an empty B row gives the single-text layout.
    len_a, len_b: int [B] pieces to keep of A and B when the caller truncated
    already (SQuAD); by default the original's rule: longest first to
    seq_length - 3 for pairs, A to seq_length - 2 alone.
    Returns int32 [B, S] input_word_ids, input_mask, input_type_ids.
    """
    full_a = ids_a.row_lengths()
    full_b = ids_b.row_lengths()
    if len_a is None:
        len_a, len_b = truncated_pair_lengths(full_a, full_b, seq_length - 3)
        len_a = tf.where(full_b > 0, len_a, tf.minimum(full_a, seq_length - 2))
    len_a = tf.cast(len_a, tf.int64)[:, None]  # [B, 1]
    len_b = tf.cast(len_b, tf.int64)[:, None]  # [B, 1]
    dense_a = ids_a.to_tensor(0)  # [B, Ta]
    dense_b = ids_b.to_tensor(0)  # [B, Tb]
    # Dense gathers, not ragged concatenation: every output position p knows
    # what it holds from the two lengths alone (cheap to trace and to run).
    p = tf.range(seq_length, dtype=tf.int64)[None, :]  # [1, S]
    in_a = (p >= 1) & (p <= len_a)  # [B, S]
    sep_a = tf.equal(p, len_a + 1)
    in_b = (p >= len_a + 2) & (p < len_a + 2 + len_b)
    sep_b = tf.equal(p, len_a + 2 + len_b) & (len_b > 0)
    from_a = tf.gather(tf.pad(dense_a, [[0, 0], [0, 1]]),
                       tf.clip_by_value(p - 1 + 0 * len_a, 0, tf.shape(dense_a, out_type=tf.int64)[1]), batch_dims=1)
    from_b = tf.gather(tf.pad(dense_b, [[0, 0], [0, 1]]),
                       tf.clip_by_value(p - len_a - 2, 0, tf.shape(dense_b, out_type=tf.int64)[1]), batch_dims=1)
    cls = tf.cast(cls_id, tf.int64)
    sep = tf.cast(sep_id, tf.int64)
    word_ids = tf.where(tf.equal(p, 0), cls, tf.zeros_like(from_a))
    word_ids = tf.where(in_a, from_a, word_ids)
    word_ids = tf.where(sep_a | sep_b, sep, word_ids)
    word_ids = tf.where(in_b, from_b, word_ids)  # [B, S]
    mask = p < len_a + 2 + len_b + tf.cast(len_b > 0, tf.int64)
    type_ids = (in_b | sep_b)
    return {
        "input_word_ids": tf.cast(word_ids, tf.int32),
        "input_mask": tf.cast(mask, tf.int32),
        "input_type_ids": tf.cast(type_ids, tf.int32),
    }


def tokenizer_metadata(do_lower_case: bool, strip_accents: Optional[bool]) -> dict:
    """What the in-graph tokenizer does, and where it can differ from FullTokenizer (the export's metadata)."""
    import tensorflow_text as tf_text

    diffs = unicode_differences()
    return {
        "rules": "FullTokenizer (google-research/bert tokenization.py), in-graph with tensorflow-text",
        "do_lower_case": bool(do_lower_case),
        "strip_accents": bool(do_lower_case if strip_accents is None else strip_accents),
        "max_chars_per_word": 200,
        "python_unicode_version": unicodedata.unidata_version,
        "tensorflow_version": tf.__version__,
        "tensorflow_text_version": getattr(tf_text, "__version__", "unknown"),
        "patched_characters": {
            "lower": "".join(sorted(diffs["lower"])) if do_lower_case else "",
            "nfd": "".join(sorted(diffs["nfd"])),
        },
        "differences_from_fulltokenizer": [
            "Character classes (control, whitespace, punctuation, Mn) were copied from Python "
            f"{unicodedata.unidata_version} unicodedata at export; lower-casing and NFD run on the ICU of the "
            "serving tensorflow / tensorflow-text, patched at export for every single code point where that "
            "ICU disagreed with Python. Serving with other tensorflow(-text) versions may change characters "
            "whose Unicode properties changed between versions.",
            "Final sigma: a capital sigma next to a character whose case-ignorable/cased property differs "
            "between Python's and ICU's Unicode version (e.g. U+0898-089F, U+1734) can lower-case to the "
            "other sigma form (about 300 such code points, none in ordinary text).",
            "Invalid UTF-8 is dropped as Python's decode(errors='ignore') does; the exact bytes dropped "
            "around an invalid sequence may differ.",
            "Vocab lines that are duplicates after stripping keep the last id for lookup, as the original; "
            "the earlier line's id detokenizes to a placeholder.",
        ],
    }
