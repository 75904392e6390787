"""CoNLL-2003 named-entity recognition: read, featurize (first word piece labelled), score, write back.

File format (docs/reference.md §7): one word per line, `word POS chunk NER` separated by spaces,
a blank line between sentences, `-DOCSTART-` lines between documents. The NER tag is the
last column. As in the BERT paper, only the first word piece of each word carries the
word's label; the other pieces, [CLS], [SEP] and padding get `IGNORE_LABEL_ID`.

A sentence with more pieces than fit in `max_seq_length` is cut into several windows of
whole words one after another (no word is lost), or, given a `doc_stride`, into overlapping
windows of pieces `doc_stride` apart as SQuAD's context (bert_tf.tasks.windows): a word is then
labelled (trained and predicted) only in the window that gives its first piece the most context.
`window_predictions_to_labels` reassembles them.

Scoring is conlleval's (the CoNLL shared-task Perl script): entity chunks from IOB1 or
IOB2 tags, a chunk counts as correct when its start, end and type all match; precision,
recall and F1 over chunks, plus token accuracy.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from bert_tf.errors import InputDataError
from bert_tf.fileio import write_text_atomic
from bert_tf.tasks import IGNORE_LABEL_ID, INPUT_FIELDS, padded_arrays, read_text
from bert_tf.tasks.glue import tokens_to_ids
from bert_tf.tasks.windows import check_is_max_context, doc_spans_for

DOCSTART = "-DOCSTART-"
# The CoNLL-2003 tag set in IOB1 as distributed (B- only between two adjacent entities of one type).
CONLL2003_LABELS = ("O", "B-MISC", "I-MISC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")


@dataclasses.dataclass
class NerExample:
    """One sentence. columns: each word's whole line split on whitespace (kept for writing back);
    labels: each word's tag (the last column), or None for unlabeled input."""

    guid: str
    words: List[str]
    labels: Optional[List[str]]
    columns: List[List[str]]
    docstart_before: bool = False  # a -DOCSTART- line preceded this sentence


@dataclasses.dataclass
class NerFeatures:
    """One window of one sentence.

    input_ids, input_mask, segment_ids, label_ids: int lists (unpadded unless asked); label_ids
    holds the word's label id at each word's first piece and IGNORE_LABEL_ID elsewhere.
    word_start: index in the sentence of the window's first labelled word; label_positions: for each
    word the window labels (in order, consecutive words), the position of its first piece.
    """

    example_index: int
    word_start: int
    input_ids: List[int]
    input_mask: List[int]
    segment_ids: List[int]
    label_ids: List[int]
    label_positions: List[int]


def read_conll(input_file: str, has_labels: bool = True) -> List[NerExample]:
    """Reads a CoNLL file into sentences. has_labels: the last column is the tag (at least two
    columns per line); False reads words only (the first column).

    Raises InputDataError (file:line) for a word line without a tag and for bad UTF-8.
    """
    examples = []
    words, labels, columns = [], [], []
    docstart_pending = False
    first_column_count = None

    def flush():
        nonlocal words, labels, columns, docstart_pending
        if words:
            examples.append(NerExample(f"{os.path.basename(input_file)}-{len(examples)}", words,
                                       labels if has_labels else None, columns, docstart_pending))
            docstart_pending = False
        words, labels, columns = [], [], []

    for line_number, line in enumerate(read_text(input_file).split("\n"), start=1):
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == DOCSTART:
            flush()
            docstart_pending = True
            continue
        if has_labels and len(fields) < 2:
            raise InputDataError(f"{input_file}:{line_number}: expected 'word ... NER-tag' (at least 2 "
                                f"space-separated columns), found {len(fields)}")
        if first_column_count is None:
            first_column_count = len(fields)
        elif has_labels and len(fields) != first_column_count:
            raise InputDataError(f"{input_file}:{line_number}: expected {first_column_count} columns as on the first "
                                f"word line, found {len(fields)}")
        words.append(fields[0])
        labels.append(fields[-1])
        columns.append(fields)
    flush()
    return examples


def label_list(examples: Sequence[NerExample]) -> List[str]:
    """The tags used in `examples`: "O" first, then by entity type and B- before I-."""
    tags = {t for e in examples for t in (e.labels or [])}
    return sorted(tags, key=lambda t: (t != "O", t.partition("-")[2], t))


def convert_examples_to_features(
    examples: Sequence[NerExample],
    labels: Sequence[str],
    max_seq_length: int,
    tokenizer,
    pad_to_max_length: bool = False,
    doc_stride: int = 0,
) -> List[NerFeatures]:
    """Sentences -> windows `[CLS] pieces [SEP]` (see the module docstring).

    doc_stride 0: windows of whole words one after another; a single word with more pieces than
    fit keeps its first pieces. doc_stride > 0: overlapping windows of pieces, each starting
    doc_stride pieces after the previous; each word labelled in its first piece's max-context window.
    A word that tokenizes to nothing (only control characters) becomes [UNK] so it still gets a
    prediction.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3, got {max_seq_length}")
    if doc_stride < 0:
        raise ValueError(f"doc_stride must be positive (or 0: windows of whole words), got {doc_stride}")
    label_to_id = {label: i for i, label in enumerate(labels)}
    room = max_seq_length - 2  # [CLS] and [SEP]
    features = []
    all_pieces = _tokenize_words(tokenizer, [w for e in examples for w in e.words])
    offset = 0
    for example_index, example in enumerate(examples):
        pieces = all_pieces[offset: offset + len(example.words)]
        offset += len(example.words)
        if example.labels is not None:
            unknown = [t for t in example.labels if t not in label_to_id]
            if unknown:
                raise InputDataError(f"sentence {example.guid}: unknown tag {unknown[0]!r} "
                                    f"(expected one of {', '.join(labels)})")
        word_ids = [label_to_id[t] for t in example.labels] if example.labels is not None else None
        if doc_stride:
            features += _stride_windows(example_index, pieces, word_ids, room, doc_stride, tokenizer,
                                        max_seq_length if pad_to_max_length else 0)
            continue
        start = 0
        while start < len(example.words):
            tokens, label_ids, positions = ["[CLS]"], [IGNORE_LABEL_ID], []
            end = start
            while end < len(example.words):
                word_pieces = pieces[end][:room]
                if end > start and len(tokens) - 1 + len(word_pieces) > room:
                    break
                positions.append(len(tokens))
                label_id = word_ids[end] if word_ids is not None else 0
                tokens += word_pieces
                label_ids += [label_id] + [IGNORE_LABEL_ID] * (len(word_pieces) - 1)
                end += 1
            tokens.append("[SEP]")
            label_ids.append(IGNORE_LABEL_ID)
            features.append(_window(example_index, start, tokens, label_ids, positions, tokenizer,
                                    max_seq_length if pad_to_max_length else 0))
            start = end
    return features


def _stride_windows(example_index: int, pieces: Sequence[List[str]], word_ids: Optional[List[int]], room: int,
                    doc_stride: int, tokenizer, pad_to: int) -> List[NerFeatures]:
    """One sentence's overlapping piece windows; a word is labelled where its first piece has most context."""
    flat, first_piece = [], []  # the sentence's pieces; the index in `flat` of each word's first piece
    for word_pieces in pieces:
        first_piece.append(len(flat))
        flat += word_pieces
    spans = doc_spans_for(len(flat), room, doc_stride)
    features = []
    for span_index, (start, length) in enumerate(spans):
        tokens = ["[CLS]"] + flat[start:start + length] + ["[SEP]"]
        label_ids = [IGNORE_LABEL_ID] * len(tokens)
        owned = [w for w, p in enumerate(first_piece)
                 if start <= p < start + length and check_is_max_context(spans, span_index, p)]
        positions = [first_piece[w] - start + 1 for w in owned]
        for w, position in zip(owned, positions, strict=True):
            label_ids[position] = word_ids[w] if word_ids is not None else 0
        features.append(_window(example_index, owned[0] if owned else 0, tokens, label_ids, positions, tokenizer,
                                pad_to))
    return features


def _window(example_index, word_start, tokens, label_ids, positions, tokenizer, pad_to: int) -> NerFeatures:
    """The NerFeatures of one window's tokens, zero-padded to `pad_to` when it is not 0."""
    input_ids = tokens_to_ids(tokenizer, tokens)
    input_mask, segment_ids = [1] * len(input_ids), [0] * len(input_ids)
    if pad_to:
        pad = pad_to - len(input_ids)
        input_ids, input_mask, segment_ids = input_ids + [0] * pad, input_mask + [0] * pad, segment_ids + [0] * pad
        label_ids = label_ids + [IGNORE_LABEL_ID] * pad
    return NerFeatures(example_index, word_start, input_ids, input_mask, segment_ids, label_ids, positions)


def _tokenize_words(tokenizer, words: Sequence[str]) -> List[List[str]]:
    if hasattr(tokenizer, "tokenize_batch"):
        pieces = [list(p) for p in tokenizer.tokenize_batch(list(words))]
    else:
        pieces = [tokenizer.tokenize(w) for w in words]
    return [p if p else ["[UNK]"] for p in pieces]


def features_to_arrays(features: Sequence[NerFeatures], seq_length: Optional[int] = None) -> Dict[str, np.ndarray]:
    """input_ids, input_mask, segment_ids: int32 [N, S] zero-padded; label_ids: int32 [N, S]
    padded with IGNORE_LABEL_ID (mask the loss with `label_ids != IGNORE_LABEL_ID`)."""
    return padded_arrays(features, seq_length, INPUT_FIELDS + ("label_ids",), fill={"label_ids": IGNORE_LABEL_ID})


def window_predictions_to_labels(
    examples: Sequence[NerExample], features: Sequence[NerFeatures], position_predictions, labels: Sequence[str]
) -> List[List[str]]:
    """Per-position predicted label ids [N_features, S] (e.g. the arg-max of the logits) ->
    one tag per word of every sentence."""
    out = [[None] * len(e.words) for e in examples]
    for feature, row in zip(features, position_predictions, strict=True):
        for k, position in enumerate(feature.label_positions):
            out[feature.example_index][feature.word_start + k] = labels[int(row[position])]
    for e, tags in zip(examples, out, strict=True):
        if any(t is None for t in tags):
            raise ValueError(f"sentence {e.guid}: some words have no prediction (features missing?)")
    return out


def conll_text(examples: Sequence[NerExample], predicted: Sequence[Sequence[str]]) -> str:
    """The input lines with the predicted tag appended (`word POS chunk gold pred`, the conlleval
    input format), a blank line after each sentence, -DOCSTART- lines kept."""
    lines = []
    for example, tags in zip(examples, predicted, strict=True):
        if example.docstart_before:
            width = len(example.columns[0]) if example.columns else 1
            lines += [" ".join([DOCSTART] + ["-X-"] * max(width - 2, 0) + ["O"] * (width > 1) + ["O"]), ""]
        for cols, tag in zip(example.columns, tags, strict=True):
            lines.append(" ".join(cols + [tag]))
        lines.append("")
    return "\n".join(lines) + "\n"


def write_conll_predictions(path: str, examples, predicted) -> None:
    write_text_atomic(path, conll_text(examples, predicted))


# ----------------------------------------------------------------- conlleval
def _split_tag(tag: str):
    """conlleval's split: "B-PER" -> ("B", "PER"); "O" -> ("O", "")."""
    prefix, sep, entity_type = tag.partition("-")
    return (prefix, entity_type) if sep else (tag, "")


def _end_of_chunk(prev_tag, tag, prev_type, cur_type) -> bool:
    """Whether a chunk ended between the previous word and this one (conlleval's endOfChunk)."""
    return (
        (prev_tag == "B" and tag in ("B", "O"))
        or (prev_tag == "I" and tag in ("B", "O"))
        or (prev_tag == "E" and tag in ("E", "I", "O"))
        or (prev_tag not in ("O", ".") and prev_type != cur_type)
        or prev_tag in ("]", "[")
    )


def _start_of_chunk(prev_tag, tag, prev_type, cur_type) -> bool:
    """Whether a chunk starts at this word (conlleval's startOfChunk)."""
    return (
        (tag == "B" and prev_tag in ("B", "I", "O"))
        or (tag == "I" and prev_tag in ("O", "E"))
        or (tag == "E" and prev_tag in ("E", "O"))
        or (tag not in ("O", ".") and prev_type != cur_type)
        or tag in ("[", "]")
    )


def conlleval(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> Dict:
    """Entity-level scores with conlleval's semantics over sentences of tags (IOB1 or IOB2).

    Returns {"precision", "recall", "f1", "accuracy"} as fractions in [0, 1] (conlleval prints
    percents), the counts "found_gold", "found_predicted", "correct", and "per_type":
    {type: {"precision", "recall", "f1", "found_gold", "found_predicted", "correct"}}.
    """
    correct_chunks, found_gold, found_pred = collections.Counter(), collections.Counter(), collections.Counter()
    correct_tags = token_count = 0
    for sentence_gold, sentence_pred in zip(gold, predicted, strict=True):
        if len(sentence_gold) != len(sentence_pred):
            raise ValueError(f"a sentence has {len(sentence_gold)} gold tags but {len(sentence_pred)} predicted")
        in_correct = False
        last_g, last_p, last_g_type, last_p_type = "O", "O", "", ""
        # A sentence boundary is an "O O" line for conlleval: it closes every open chunk.
        for g_full, p_full, boundary in [(g, p, False) for g, p in zip(sentence_gold, sentence_pred, strict=True)] + [
            ("O", "O", True)
        ]:
            g, g_type = _split_tag(g_full)
            p, p_type = _split_tag(p_full)
            g_end = _end_of_chunk(last_g, g, last_g_type, g_type)
            p_end = _end_of_chunk(last_p, p, last_p_type, p_type)
            if in_correct:
                if g_end and p_end and last_p_type == last_g_type:
                    in_correct = False
                    correct_chunks[last_g_type] += 1
                elif g_end != p_end or g_type != p_type:
                    in_correct = False
            g_start = _start_of_chunk(last_g, g, last_g_type, g_type)
            p_start = _start_of_chunk(last_p, p, last_p_type, p_type)
            if g_start and p_start and g_type == p_type:
                in_correct = True
            if g_start:
                found_gold[g_type] += 1
            if p_start:
                found_pred[p_type] += 1
            if not boundary:
                correct_tags += int(g == p and g_type == p_type)
                token_count += 1
            last_g, last_p, last_g_type, last_p_type = g, p, g_type, p_type
        # (The boundary above always closes a correct chunk, so in_correct is False here.)

    def scores(correct, n_gold, n_pred):
        precision = correct / n_pred if n_pred else 0.0
        recall = correct / n_gold if n_gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"precision": precision, "recall": recall, "f1": f1,
                "found_gold": n_gold, "found_predicted": n_pred, "correct": correct}

    result = scores(sum(correct_chunks.values()), sum(found_gold.values()), sum(found_pred.values()))
    result["accuracy"] = correct_tags / token_count if token_count else 0.0
    types = sorted((set(found_gold) | set(found_pred)) - {""})
    result["per_type"] = {t: scores(correct_chunks[t], found_gold[t], found_pred[t]) for t in types}
    return result
