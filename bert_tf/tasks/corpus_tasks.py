"""Small tasks generated from a verse corpus (the KJV layout: one verse per line, blank lines
between chapters), for experiments/ablations.py. Pure and seeded: plain data in, plain data out.

  next_verse_pairs  sentence pairs: is B the verse right after A ("next") or a random verse ("random")
  word_questions    SQuAD-style span questions on one verse: "What word follows 'x y'?" (the answer's
                    left context) or "What word comes before 'x y'?" (its right context)
"""

from __future__ import annotations

import re
from typing import List, Sequence, Tuple

_WORD = re.compile(r"[A-Za-z]+")
# Shorter verses leave no room for a two-word cue on either side of an answer.
MIN_VERSE_WORDS = 8
MIN_ANSWER_LETTERS = 3
DEV_EVERY = 5  # every 5th chapter is held out for dev


def read_chapters(path: str, max_lines: int | None = None) -> List[List[str]]:
    """The corpus as chapters (lists of verses): one verse per line, blank lines between chapters."""
    chapters, current, count = [], [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                if current:
                    chapters.append(current)
                current = []
                continue
            current.append(line)
            count += 1
            if max_lines and count >= max_lines:
                break
    if current:
        chapters.append(current)
    return chapters


def split_chapters(chapters: Sequence[List[str]], dev_every: int = DEV_EVERY):
    """(train chapters, dev chapters): every dev_every-th chapter is held out, so no verse is in both."""
    return ([c for i, c in enumerate(chapters) if i % dev_every],
            [c for i, c in enumerate(chapters) if not i % dev_every])


def next_verse_pairs(chapters: Sequence[List[str]], n: int, rng) -> List[Tuple[str, str, str]]:
    """n (a, b, label) rows, half "next" (b follows a in its chapter), half "random" (b from another chapter).

    rng: a random.Random.
    """
    consecutive = [(c[i], c[i + 1]) for c in chapters for i in range(len(c) - 1)]
    rows = []
    for k in range(n):
        if k % 2 == 0:
            a, b = consecutive[rng.randrange(len(consecutive))]
            rows.append((a, b, "next"))
        else:
            ci = rng.randrange(len(chapters))
            a = rng.choice(chapters[ci])
            others = [c for j, c in enumerate(chapters) if j != ci] or list(chapters)
            rows.append((a, rng.choice(rng.choice(others)), "random"))
    rng.shuffle(rows)
    return rows


def word_questions(chapters: Sequence[List[str]], n: int, rng) -> List[Tuple[str, str, str, str, int, str]]:
    """n questions about one verse each, alternately about the answer's left and right context.

    -> (id, context, question, answer_text, answer_start, kind) with kind "after" | "before";
    context[answer_start:][:len(answer_text)] == answer_text, and the two-word cue occurs
    once in the verse, so the answer is unique. rng: a random.Random.
    """
    verses = [v for c in chapters for v in c if len(_WORD.findall(v)) >= MIN_VERSE_WORDS]
    if not verses:
        raise ValueError(f"no verse with {MIN_VERSE_WORDS} or more words to ask about")
    out = []
    attempts = 0
    while len(out) < n and attempts < 50 * n:
        attempts += 1
        verse = rng.choice(verses)
        words = [(m.group(0), m.start()) for m in _WORD.finditer(verse)]
        lowered = [w.lower() for w, _ in words]
        kind = "after" if len(out) % 2 == 0 else "before"
        i = rng.randrange(2, len(words) - 2)
        answer, start = words[i]
        if len(answer) < MIN_ANSWER_LETTERS:
            continue
        cue = lowered[i - 2:i] if kind == "after" else lowered[i + 1:i + 3]
        bigrams = [lowered[j:j + 2] for j in range(len(lowered) - 1)]
        if bigrams.count(cue) != 1:
            continue
        cue_text = " ".join(cue)
        question = (f'What word follows "{cue_text}"?' if kind == "after"
                    else f'What word comes before "{cue_text}"?')
        out.append((f"q{len(out)}", verse, question, answer, start, kind))
    return out


def squad_json(questions) -> dict:
    """word_questions' output as a SQuAD v1.1 file's JSON (one paragraph per question)."""
    data = [{"title": qid, "paragraphs": [{"context": context, "qas": [
        {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": start}]}]}]}
        for qid, context, question, answer, start, _ in questions]
    return {"version": "1.1", "data": data}
