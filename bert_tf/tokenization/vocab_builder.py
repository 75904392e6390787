"""Learn a WordPiece vocab from a corpus (for pretraining on a new language or domain).

Words come from the original's BasicTokenizer rules (cleaning, CJK splitting,
lower-casing and accent stripping as asked, punctuation splitting). The
pieces are learned by greedy pair merging over word counts, the way
WordPiece vocabularies are usually built in the open (Google's own trainer was
never released): every word starts as its characters, word-initial `c` and
continuation `##c`; the most frequent adjacent pair is merged into one piece
(`w` + `##o` -> `wo`, `##o` + `##r` -> `##or`) and added to the vocab, until
the vocab has `vocab_size` entries or no pair occurs `min_frequency` times.
WordPiece tokenization (greedy longest match, docs/reference.md §5) then splits
words with this vocab.

Layout, as the original vocabs: [PAD], [unused0..num_unused-1], [UNK], [CLS],
[SEP], [MASK] (with the default 99 unused tokens these have ids 0, 100, 101,
102, 103 as in bert-base-uncased), then every single character of the corpus
and its ## form (so a word is only [UNK] when it holds a character dropped
for space, or is longer than the WordPiece limit), then the learned pieces in
the order they were learned. Ties are broken by the pieces' text, so the
result is deterministic.

Extending an existing vocab for a domain (`extend_vocab`): its [unusedN] slots
take the corpus's words that the vocab splits into the most pieces, weighted by
frequency; every other id stays, so checkpoints of the old vocab stay valid. A
JSON beside the new vocab (`extension_path`) lists each new token with the old
pieces it replaces, from which a checkpoint's embedding rows for the new tokens
start (bert_tf.pretrained.init_new_token_embeddings).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import json
import os
import re
from typing import Dict, Iterable, List, Optional, Tuple

from bert_tf import fileio
from bert_tf.errors import InputDataError
from bert_tf.fileio import write_text_atomic
from bert_tf.tokenization.full import MAX_CHARS_PER_WORD, BasicTokenizer, WordpieceTokenizer, load_vocab

DEFAULT_VOCAB_SIZE = 30522
DEFAULT_NUM_UNUSED = 99  # [unused0..98]: [UNK]/[CLS]/[SEP]/[MASK] get ids 100-103 as in the original vocabs
DEFAULT_MIN_FREQUENCY = 2  # a pair seen once is not worth a vocab entry
DEFAULT_MAX_WORDS = 2_000_000  # distinct words kept for learning (the most frequent); memory bound
PREFIX = "##"


def special_tokens(num_unused: int = DEFAULT_NUM_UNUSED) -> List[str]:
    return ["[PAD]"] + [f"[unused{i}]" for i in range(num_unused)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def count_words(lines: Iterable[str], do_lower_case: bool = True, strip_accents: Optional[bool] = None,
                line_prefix_regex: Optional[str] = None) -> "collections.Counter[str]":
    """Word counts after the BasicTokenizer rules.

    BasicTokenizer runs once per distinct whitespace-separated chunk (all its
    rules act within a chunk), weighted by the chunk's count, which is the
    same as tokenizing every line and much faster on natural text.
    """
    return chunk_words(count_chunks(lines, line_prefix_regex), do_lower_case, strip_accents)


def count_chunks(lines: Iterable[str], line_prefix_regex: Optional[str] = None) -> "collections.Counter[str]":
    """Counts of the whitespace-separated chunks of the lines (after removing the line prefix)."""
    prefix = re.compile(line_prefix_regex) if line_prefix_regex else None
    chunks: "collections.Counter[str]" = collections.Counter()
    for line in lines:
        if prefix is not None:
            line = prefix.sub("", line, count=1)
        chunks.update(line.split())
    return chunks


def chunk_words(chunks: Dict[str, int], do_lower_case: bool = True,
                strip_accents: Optional[bool] = None) -> "collections.Counter[str]":
    """Word counts of chunk counts: BasicTokenizer once per distinct chunk, weighted by its count.

    Counts of parts of a corpus add up to the corpus's counts (the Beam pipeline's combine)."""
    basic = BasicTokenizer(do_lower_case=do_lower_case, strip_accents=strip_accents)
    words: "collections.Counter[str]" = collections.Counter()
    for chunk, n in chunks.items():
        for word in basic.tokenize(chunk):
            words[word] += n
    return words


@dataclasses.dataclass(frozen=True)
class VocabSettings:
    """create_vocab's flags that turn word counts into a vocab."""

    vocab_file: str
    vocab_size: int = DEFAULT_VOCAB_SIZE
    num_unused: int = DEFAULT_NUM_UNUSED
    min_frequency: int = DEFAULT_MIN_FREQUENCY
    extend_vocab: Optional[str] = None  # an existing vocab.txt whose [unusedN] slots are filled
    max_new_tokens: Optional[int] = None

    def check(self) -> None:
        """Raises ValueError (one line) for settings that cannot give a vocab, before any counting."""
        for name in ("num_unused", "min_frequency"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: must be >= 0, got {self.max_new_tokens}")
        if self.extend_vocab:
            if not any(UNUSED_TOKEN.match(t) for t in load_vocab(self.extend_vocab)):
                raise InputDataError(f"extend_vocab: {self.extend_vocab} has no [unusedN] slots to fill")
        elif self.vocab_size <= len(special_tokens(self.num_unused)):
            raise ValueError(f"vocab_size: {self.vocab_size} leaves no room after "
                             f"{len(special_tokens(self.num_unused))} special tokens")


def make_vocab(words: Dict[str, int], settings: VocabSettings, log, source: str = "the input") -> List[str]:
    """Learns (or extends) the vocab from word counts, writes it (and the extension JSON), logs its statistics."""
    if not words:
        raise ValueError(f"input_file: no words in {source} (empty corpus)")
    log.info("%d distinct words, %d in all", len(words), sum(words.values()))
    if settings.extend_vocab:
        base = list(load_vocab(settings.extend_vocab))
        vocab, new_tokens = extend_vocab(base, words, settings.max_new_tokens, settings.min_frequency)
    else:
        vocab = learn_wordpiece_vocab(words, settings.vocab_size, settings.num_unused, settings.min_frequency)
    write_vocab(settings.vocab_file, vocab)
    log.info("Wrote %d tokens to %s", len(vocab), settings.vocab_file)
    if settings.extend_vocab:
        path = write_extension(settings.vocab_file, settings.extend_vocab, new_tokens)
        log.info("Filled %d [unused] slots (e.g. %s); listed with their old pieces in %s", len(new_tokens),
                 ", ".join(t.token for t in new_tokens[:8]), path)
        _log_stats(log, f" with {settings.extend_vocab}", base, words)
    _log_stats(log, f" with {settings.vocab_file}" if settings.extend_vocab else "", vocab, words)
    return vocab


def _log_stats(log, label, vocab, words):
    stats = word_stats(vocab, words)
    log.info("On the corpus%s: [UNK] %.4f%% of wordpieces, %.3f wordpieces per word", label,
             100 * stats["unk_rate"], stats["pieces_per_word"])


def _merged(a: str, b: str) -> str:
    return a + b[len(PREFIX):]


def learn_wordpiece_vocab(word_counts: Dict[str, int], vocab_size: int = DEFAULT_VOCAB_SIZE,
                          num_unused: int = DEFAULT_NUM_UNUSED, min_frequency: int = DEFAULT_MIN_FREQUENCY,
                          max_words: int = DEFAULT_MAX_WORDS) -> List[str]:
    """The vocab, as a list of tokens (id = index).

    Raises ValueError when vocab_size cannot hold the special tokens.
    """
    specials = special_tokens(num_unused)
    if vocab_size <= len(specials):
        raise ValueError(f"vocab_size: {vocab_size} leaves no room after {len(specials)} special tokens")
    # Most frequent words first; ties by text. Words too long for WordPiece are [UNK] anyway.
    items = sorted(((w, c) for w, c in word_counts.items() if 0 < len(w) <= MAX_CHARS_PER_WORD),
                   key=lambda wc: (-wc[1], wc[0]))[:max_words]
    words: List[List[str]] = [[w[0]] + [PREFIX + ch for ch in w[1:]] for w, _ in items]
    counts = [c for _, c in items]

    # Alphabet: every symbol, by frequency, then text; cut only if it alone overflows the vocab.
    symbol_counts: "collections.Counter[str]" = collections.Counter()
    for symbols, c in zip(words, counts, strict=True):
        for s in symbols:
            symbol_counts[s] += c
    # Both forms of every character, so any word of these characters tokenizes without [UNK].
    for ch in {s[-1] for s in symbol_counts}:
        symbol_counts.setdefault(ch, 0)
        symbol_counts.setdefault(PREFIX + ch, 0)
    room = vocab_size - len(specials)
    alphabet = sorted(symbol_counts, key=lambda s: (-symbol_counts[s], s))[:room]
    vocab = specials + sorted(alphabet, key=lambda s: (s.startswith(PREFIX), s))
    seen = set(vocab)

    # Pair counts and the words each pair occurs in.
    pair_counts: Dict[Tuple[str, str], int] = collections.defaultdict(int)
    where: Dict[Tuple[str, str], set] = collections.defaultdict(set)
    for i, (symbols, c) in enumerate(zip(words, counts, strict=True)):
        for pair in zip(symbols, symbols[1:], strict=False):
            pair_counts[pair] += c
            where[pair].add(i)
    heap = [(-c, pair) for pair, c in pair_counts.items()]
    heapq.heapify(heap)

    while len(vocab) < vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        current = pair_counts.get(pair, 0)
        if current != -neg:  # stale entry; the current count (if any) is queued too
            continue
        if current < min_frequency:
            break
        new = _merged(*pair)
        if new not in seen:
            seen.add(new)
            vocab.append(new)
        changed = collections.Counter()
        for i in sorted(where.pop(pair, ())):
            symbols, c = words[i], counts[i]
            for old in zip(symbols, symbols[1:], strict=False):
                changed[old] -= c
            merged: List[str] = []
            j = 0
            while j < len(symbols):
                if j + 1 < len(symbols) and symbols[j] == pair[0] and symbols[j + 1] == pair[1]:
                    merged.append(new)
                    j += 2
                else:
                    merged.append(symbols[j])
                    j += 1
            words[i] = merged
            for p in zip(merged, merged[1:], strict=False):
                changed[p] += c
                where[p].add(i)
        for p, delta in changed.items():
            if delta:
                pair_counts[p] += delta
                if pair_counts[p] > 0:
                    heapq.heappush(heap, (-pair_counts[p], p))
                else:
                    pair_counts.pop(p, None)
        pair_counts.pop(pair, None)
    return vocab


def write_vocab(path: str, vocab: List[str]) -> None:
    """One token per line, through a temporary name, its folders created (local files need no TensorFlow)."""
    write_text_atomic(path, "".join(t + "\n" for t in vocab))


def word_stats(vocab: List[str], word_counts: Dict[str, int], unk_token: str = "[UNK]") -> Dict[str, float]:
    """[UNK] rate (of wordpieces) and wordpieces per word when `vocab` tokenizes words with these counts."""
    wordpiece = WordpieceTokenizer(vocab={t: i for i, t in enumerate(vocab)})
    words = pieces = unk = 0
    for word, n in word_counts.items():
        split = wordpiece.tokenize_word(word)
        words += n
        pieces += n * len(split)
        unk += n * split.count(unk_token)
    return {"words": words, "pieces": pieces, "unk": unk,
            "unk_rate": unk / max(pieces, 1), "pieces_per_word": pieces / max(words, 1)}


# ------------------------------------------------------------------ extending an existing vocab
# A vocab's reserved slots (the original vocabs: [unused0] .. [unused993]); only these change.
UNUSED_TOKEN = re.compile(r"^\[unused\d+\]$")
EXTENSION_FORMAT = "bert_tf.vocab_extension.v1"


VocabExtensionError = InputDataError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


@dataclasses.dataclass(frozen=True)
class NewToken:
    """One [unused] slot filled: the token now at `id`, what was there, and how the old vocab split it."""

    id: int
    token: str
    replaced: str
    old_pieces: Tuple[str, ...]
    old_piece_ids: Tuple[int, ...]
    count: int  # occurrences of the word in the corpus


def extension_path(vocab_file: str) -> str:
    """The JSON beside an extended vocab that lists its new tokens: kjv_vocab.txt -> kjv_vocab.extension.json.

    The model dir's side files never copy it, so a vocab copied next to a checkpoint trained with it
    is not taken for an extension of that checkpoint's vocab."""
    return os.path.splitext(vocab_file)[0] + ".extension.json"


def extend_vocab(base: List[str], word_counts: Dict[str, int], max_new_tokens: Optional[int] = None,
                 min_frequency: int = DEFAULT_MIN_FREQUENCY) -> Tuple[List[str], List[NewToken]]:
    """`base` (id = index) with its [unused] slots, in id order, filled by the corpus's most useful words.

    "Most useful": a whole word (BasicTokenizer's) that `base` does not hold, splits into k >= 2
    wordpieces without [UNK], occurring c >= min_frequency times, ranked by c * (k - 1): the
    wordpieces the corpus saves when the word becomes one token (ties by text). Only whole words
    (not ## continuations) are added, so every existing id and every other token is unchanged.
    Returns (the extended vocab, the new tokens).
    """
    slots = [i for i, t in enumerate(base) if UNUSED_TOKEN.match(t)]
    if not slots:
        raise InputDataError("the vocab has no [unusedN] slots to fill")
    limit = len(slots) if max_new_tokens is None else min(max_new_tokens, len(slots))
    ids = {t: i for i, t in enumerate(base)}
    wordpiece = WordpieceTokenizer(vocab=ids)
    unk = "[UNK]"
    scored = []
    for word, count in word_counts.items():
        if count < min_frequency or word in ids or len(word) > MAX_CHARS_PER_WORD:
            continue
        pieces = wordpiece.tokenize_word(word)
        if len(pieces) >= 2 and unk not in pieces:
            scored.append((-count * (len(pieces) - 1), word, tuple(pieces), count))
    scored.sort()
    vocab = list(base)
    new = []
    for slot, (_, word, pieces, count) in zip(slots, scored[:limit], strict=False):
        vocab[slot] = word
        new.append(NewToken(slot, word, base[slot], pieces, tuple(ids[p] for p in pieces), count))
    return vocab, new


def write_extension(vocab_file: str, base_vocab_file: str, new_tokens: List[NewToken]) -> str:
    """Writes extension_path(vocab_file): the base vocab's name and every new token with its old pieces."""
    payload = {
        "format": EXTENSION_FORMAT,
        "base_vocab": os.path.abspath(base_vocab_file) if "://" not in base_vocab_file else base_vocab_file,
        "rule": "whole words ranked by count * (old wordpieces - 1)",
        "new_tokens": [{"id": t.id, "token": t.token, "replaced": t.replaced, "old_pieces": list(t.old_pieces),
                        "old_piece_ids": list(t.old_piece_ids), "count": t.count} for t in new_tokens],
    }

    path = extension_path(vocab_file)
    write_text_atomic(path, json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    return path


def read_extension(vocab_file: str) -> List[NewToken]:
    """The new tokens of an extended vocab (from its extension JSON), or [] when it has none.

    Raises InputDataError when the JSON does not describe `vocab_file` (a token not at its id).
    """
    path = extension_path(vocab_file)
    if not fileio.exists(path):
        return []
    with fileio.open_file(path, "rb") as f:
        try:
            payload = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputDataError(f"{path}: not a vocab extension JSON ({e})") from None
    if not isinstance(payload, dict) or payload.get("format") != EXTENSION_FORMAT:
        raise InputDataError(f"{path}: not a vocab extension JSON (format is not {EXTENSION_FORMAT})")
    tokens = [NewToken(int(t["id"]), t["token"], t["replaced"], tuple(t["old_pieces"]),
                       tuple(int(i) for i in t["old_piece_ids"]), int(t["count"])) for t in payload["new_tokens"]]
    vocab = load_vocab(vocab_file)
    for t in tokens:
        if vocab.get(t.token) != t.id:
            raise InputDataError(f"{path}: lists {t.token!r} at id {t.id} but {vocab_file} does not have it "
                                      "there; the JSON belongs to another vocab")
    return tokens
