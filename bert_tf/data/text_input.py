"""Streaming readers for pretraining corpora.

Two layouts:
  * "lines" (the original's): one sentence per line, a blank line between
    documents (docs/reference.md §6).
  * "wiki": WikiExtractor output, `<doc id=.. url=.. title=..>` ... `</doc>`;
    each doc is a document, the first line (the title) is dropped, and each
    paragraph line is split into sentences by `split_sentences`.
"auto" picks "wiki" when a file's first non-blank line starts with `<doc`.

Readers yield documents as lists of raw lines (sentences, or for "wiki"
paragraphs still to be split) and never hold more than one document.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Sequence, Tuple

from bert_tf.errors import InputDataError

LINES, WIKI, AUTO = "lines", "wiki", "auto"
INPUT_FORMATS = (AUTO, LINES, WIKI)


InputError = InputDataError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


def expand_input_patterns(patterns: str) -> List[str]:
    """Comma-separated globs -> files, in order; a pattern that matches nothing is an error."""
    files: List[str] = []
    for pattern in (p.strip() for p in patterns.split(",")):
        if not pattern:
            continue
        if "://" in pattern:
            import tensorflow as tf  # gs:// and other remote file systems only

            matches = sorted(tf.io.gfile.glob(pattern))
        else:
            matches = sorted(glob.glob(os.path.expanduser(pattern)))
            matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise InputDataError(f"input_file: {pattern!r} matches no file")
        files.extend(matches)
    if not files:
        raise InputDataError("input_file: no input files given")
    return files


def _open_text(path: str):
    if "://" in path:
        import tensorflow as tf

        return tf.io.gfile.GFile(path, "r")
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="ignore")
    # Undecodable bytes are dropped, as the original's convert_to_unicode does.
    return open(path, "r", encoding="utf-8", errors="ignore")


def unreadable(path: str, error: BaseException) -> InputDataError:
    return InputDataError(f"{path}: cannot read it ({' '.join(str(error).split()) or type(error).__name__})")


def check_readable(path: str) -> None:
    """Raises InputDataError naming the file when it cannot be opened and read."""
    try:
        with _open_text(path) as f:
            f.read(1)
    except (OSError, EOFError) as e:
        raise unreadable(path, e) from None


def detect_format(path: str) -> str:
    with _open_text(path) as f:
        for line in f:
            if line.strip():
                return WIKI if line.lstrip().startswith("<doc") else LINES
    return LINES


def _read_lines_format(f) -> Iterator[List[str]]:
    doc: List[str] = []
    for line in f:
        line = line.strip()
        if line:
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


_DOC_OPEN = re.compile(r"^<doc\b[^>]*>$")
_TITLE = re.compile(r'\btitle="([^"]*)"')


def _read_wiki_format(f, path: str) -> Iterator[List[str]]:
    doc: List[str] = []
    title = None
    inside = False
    for line_number, line in enumerate(f, 1):
        line = line.strip()
        if _DOC_OPEN.match(line):
            if inside:
                raise InputDataError(f"{path}:{line_number}: <doc> opened inside another <doc>")
            inside, doc = True, []
            match = _TITLE.search(line)
            title = match.group(1) if match else None
        elif line == "</doc>":
            if not inside:
                raise InputDataError(f"{path}:{line_number}: </doc> without <doc>")
            inside = False
            if doc:
                yield doc
        elif inside and line:
            # WikiExtractor repeats the title as the first line; it is not a sentence.
            if not doc and title is not None and line == title.strip():
                title = None
                continue
            title = None
            doc.append(line)
    if inside and doc:
        yield doc


@dataclass
class RawDocument:
    """One document as read: raw lines, whether they are paragraphs to split, and their size in bytes."""

    lines: List[str]
    split: bool
    num_bytes: int


def read_documents(paths: Sequence[str], input_format: str = AUTO) -> Iterator[RawDocument]:
    """Documents of all files in order; a document never spans two files."""
    for path in paths:
        yield from read_file_documents(path, input_format)


def read_file_documents(path: str, input_format: str = AUTO) -> Iterator[RawDocument]:
    """Documents of one file in order."""
    if input_format not in INPUT_FORMATS:
        raise InputDataError(f"input_format: expected one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
    try:
        fmt = detect_format(path) if input_format == AUTO else input_format
        with _open_text(path) as f:
            docs = _read_wiki_format(f, path) if fmt == WIKI else _read_lines_format(f)
            for lines in docs:
                yield RawDocument(lines, fmt == WIKI, sum(len(s) + 1 for s in lines))
    except (OSError, EOFError) as e:  # unreadable, truncated or corrupt (.gz) files
        raise unreadable(path, e) from None


def input_size_bytes(paths: Sequence[str]) -> int:
    """Total size of the inputs on disk (for progress; 0 when unknown)."""
    total = 0
    for path in paths:
        if "://" in path or path.endswith(".gz"):
            return 0
        total += os.path.getsize(path)
    return total


# ------------------------------------------------------------------ sentence splitting
# Abbreviations after which a period does not end a sentence.
_ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx ca no nos vol vols fig figs
jan feb mar apr jun jul aug sep sept oct nov dec inc ltd co corp gen col lt sgt capt rev hon
u.s u.k p pp ed eds est dept univ
""".split())

# A candidate boundary: sentence-final punctuation, optional closing quotes or
# brackets, whitespace, then something that can start a sentence.
_BOUNDARY = re.compile(r"""([.!?]+["'\u201d\u2019)\]]*)\s+(?=["'\u201c\u2018(\[]?[A-Z0-9\u00C0-\u024F])""")


def split_sentences(paragraph: str) -> List[str]:
    """Splits a paragraph of raw prose into sentences (rule-based, English-oriented).

    A boundary is [.!?] (plus closing quotes/brackets) followed by whitespace
    and an upper-case letter, digit or opening quote, unless the period ends a
    known abbreviation or a single-letter initial ("J. R. R. Tolkien").
    """
    sentences = []
    start = 0
    for match in _BOUNDARY.finditer(paragraph):
        end = match.end(1)
        if match.group(1).startswith(".") and len(match.group(1).rstrip("\"'\u201d\u2019)]")) == 1:
            word = paragraph[start:match.start(1)].rsplit(None, 1)
            last = word[-1].lower().lstrip("(\"'\u201c") if word else ""
            if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()):
                continue
        sentence = paragraph[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = match.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def document_sentences(doc: RawDocument) -> List[str]:
    """A document's sentences: its lines, or its paragraphs split into sentences."""
    if not doc.split:
        return doc.lines
    out: List[str] = []
    for paragraph in doc.lines:
        out.extend(split_sentences(paragraph))
    return out


# ------------------------------------------------------------------ blocks
@dataclass
class Block:
    """Consecutive documents of one file processed together; the random-next pool of its documents.

    `file_index` (the file's place in the expanded input list) and `index` (the
    block's place in that file) name the block: its seeds and its order.
    """

    index: int
    first_document: int
    documents: List[RawDocument]
    file_index: int = 0

    @property
    def num_bytes(self) -> int:
        return sum(d.num_bytes for d in self.documents)

    @property
    def key(self) -> Tuple[int, int]:
        return self.file_index, self.index


def iter_file_blocks(path: str, file_index: int, input_format: str, block_bytes: int) -> Iterator[Block]:
    """The blocks of one input file (the unit of work of the local tool and of the Beam pipeline).

    Blocks never span two files, so every file can be read on its own, in any
    order and on any machine, and still give the same blocks.
    """
    for block in iter_blocks(read_file_documents(path, input_format), block_bytes):
        block.file_index = file_index
        yield block


def iter_input_blocks(paths: Sequence[str], input_format: str, block_bytes: int) -> Iterator[Block]:
    """The blocks of all files, file by file, in order."""
    for file_index, path in enumerate(paths):
        yield from iter_file_blocks(path, file_index, input_format, block_bytes)


def iter_blocks(documents: Iterable[RawDocument], block_bytes: int, min_docs: int = 2) -> Iterator[Block]:
    """Groups documents into blocks of about `block_bytes` bytes with at least `min_docs` documents.

    Block boundaries depend only on the input and these two numbers, never on
    worker count or timing, which is what makes the output reproducible. A
    final block with fewer than `min_docs` documents is merged into the one
    before it, so no document is its own only random-next candidate unless
    the whole corpus is one document.
    """
    pending = None
    current: List[RawDocument] = []
    size = 0
    index = 0
    first = 0
    for doc in documents:
        current.append(doc)
        size += doc.num_bytes
        if size >= block_bytes and len(current) >= min_docs:
            if pending is not None:
                yield pending
            pending = Block(index, first, current)
            index += 1
            first += len(current)
            current, size = [], 0
    if current:
        if pending is not None and len(current) < min_docs:
            pending.documents.extend(current)
        else:
            if pending is not None:
                yield pending
            pending = Block(index, first, current)
    if pending is not None:
        yield pending
