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
"""

from __future__ import annotations

import collections
import heapq
import re
from typing import Dict, Iterable, List, Optional, Tuple

from bert_tf.tokenization.full import MAX_CHARS_PER_WORD, BasicTokenizer

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
    prefix = re.compile(line_prefix_regex) if line_prefix_regex else None
    chunks: "collections.Counter[str]" = collections.Counter()
    for line in lines:
        if prefix is not None:
            line = prefix.sub("", line, count=1)
        chunks.update(line.split())
    basic = BasicTokenizer(do_lower_case=do_lower_case, strip_accents=strip_accents)
    words: "collections.Counter[str]" = collections.Counter()
    for chunk, n in chunks.items():
        for word in basic.tokenize(chunk):
            words[word] += n
    return words


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
    """One token per line, through a temporary name (local files without TensorFlow)."""
    text = "".join(t + "\n" for t in vocab)
    if "://" in path:
        from bert_tf.configs import write_text_atomic

        write_text_atomic(path, text)
        return
    import os

    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def word_stats(vocab: List[str], word_counts: Dict[str, int], unk_token: str = "[UNK]") -> Dict[str, float]:
    """[UNK] rate (of wordpieces) and wordpieces per word when `vocab` tokenizes words with these counts."""
    from bert_tf.tokenization.full import WordpieceTokenizer

    wordpiece = WordpieceTokenizer(vocab={t: i for i, t in enumerate(vocab)})
    words = pieces = unk = 0
    for word, n in word_counts.items():
        split = wordpiece.tokenize_word(word)
        words += n
        pieces += n * len(split)
        unk += n * split.count(unk_token)
    return {"words": words, "pieces": pieces, "unk": unk,
            "unk_rate": unk / max(pieces, 1), "pieces_per_word": pieces / max(words, 1)}
