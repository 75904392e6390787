"""SQuAD v1.1 / v2.0: read the JSON, cut examples into doc-stride features, turn logits into answers.

The procedure is the original's (docs/reference.md §7), so predictions match it:
- the context is split on whitespace into words (`doc_tokens`); answers are word spans;
- each word is word-pieced; a context longer than the room left by the question
  (`max_seq_length - len(query) - 3`) becomes several overlapping spans, each starting
  `doc_stride` pieces after the previous one;
- a piece seen in several spans is "max context" only in the span where
  `min(left context, right context) + 0.01 * span length` is largest;
- an answer not wholly inside a span, and an impossible question, point at [CLS] (0, 0);
- post-processing keeps the top `n_best_size` starts and ends per feature, drops spans
  outside the context, not at a max-context start, reversed or longer than
  `max_answer_length`, and maps the best pieces back to the original text
  (`get_final_text`). For v2.0 the null answer competes through
  `score_null - best_non_null > null_score_diff_threshold`.

Unlike the original, a v2.0 question whose n-best holds only the null answer predicts ""
instead of crashing (its null odds are `NULL_ODDS_WITHOUT_SPAN`).

Sequence layout of a feature: `[CLS] query [SEP] doc-span [SEP]`, segment 1 on the span
and the last [SEP]. Dimension letters: S = max_seq_length.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from bert_tf.errors import InputDataError
from bert_tf.fileio import write_text_atomic
from bert_tf.tasks import padded_arrays, read_text
from bert_tf.tasks.glue import tokenize_all, tokens_to_ids
from bert_tf.tasks.windows import MAX_CONTEXT_LENGTH_WEIGHT, check_is_max_context, doc_spans_for  # noqa: F401
from bert_tf.tokenization import BasicTokenizer

# The original's defaults (run_squad.py flags).
DEFAULT_MAX_SEQ_LENGTH = 384
DEFAULT_DOC_STRIDE = 128
DEFAULT_MAX_QUERY_LENGTH = 64
DEFAULT_N_BEST_SIZE = 20
DEFAULT_MAX_ANSWER_LENGTH = 30
DEFAULT_NULL_SCORE_DIFF_THRESHOLD = 0.0
# The first feature's unique_id (the original's, so ids in logs and files look the same).
FIRST_UNIQUE_ID = 1000000000
# null_odds.json value of a v2.0 question without any non-null candidate (the original crashed there):
# "certainly no answer", far above any threshold a sweep over real score differences would pick.
NULL_ODDS_WITHOUT_SPAN = 1e6


@dataclasses.dataclass
class SquadExample:
    """One question. doc_tokens: the context split on whitespace. start/end_position: word
    indexes of the (first) answer, training only; -1 for impossible questions; None at eval."""

    qas_id: str
    question_text: str
    doc_tokens: List[str]
    orig_answer_text: Optional[str] = None
    start_position: Optional[int] = None
    end_position: Optional[int] = None
    is_impossible: bool = False


@dataclasses.dataclass
class SquadFeatures:
    """One (question, doc span) window.

    input_ids, input_mask, segment_ids: int lists [S] (zero-padded unless asked otherwise).
    tokens: the word pieces of the window; token_to_orig_map: window position -> word index in
    the example's doc_tokens (context positions only); token_is_max_context: window position ->
    whether this window is the max-context one for that piece.
    start_position, end_position: window positions of the answer (0 = [CLS]: no answer in this
    window or impossible question); None when not training.
    """

    unique_id: int
    example_index: int
    doc_span_index: int
    tokens: List[str]
    token_to_orig_map: Dict[int, int]
    token_is_max_context: Dict[int, bool]
    input_ids: List[int]
    input_mask: List[int]
    segment_ids: List[int]
    start_position: Optional[int] = None
    end_position: Optional[int] = None
    is_impossible: bool = False


class RawResult(NamedTuple):
    """The model output of one feature: start/end logits float [S] (or at least len(tokens))."""

    unique_id: int
    start_logits: Sequence[float]
    end_logits: Sequence[float]


# ----------------------------------------------------------------- reading
def is_whitespace(c: str) -> bool:
    """The characters that separate context words (NARROW NO-BREAK SPACE included, as the original)."""
    return c in (" ", "\t", "\r", "\n") or ord(c) == 0x202F


def split_context(context: str):
    """(doc_tokens, char_to_word_offset): the context's whitespace-separated words, and for
    each character the index of the word it belongs to (whitespace: the preceding word)."""
    doc_tokens, char_to_word_offset = [], []
    prev_is_whitespace = True
    for c in context:
        if is_whitespace(c):
            prev_is_whitespace = True
        else:
            if prev_is_whitespace:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_is_whitespace = False
        char_to_word_offset.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word_offset


def _expect(condition, path, where, what):
    if not condition:
        raise InputDataError(f"{path}: {where}: expected {what}")


def read_squad_examples(
    input_file: str,
    is_training: bool,
    version_2_with_negative: bool = False,
    skip_mismatched_answers: bool = False,
) -> List[SquadExample]:
    """Reads a SQuAD JSON file into examples.

    is_training: read the answer position (the first answer of an answerable question).
    version_2_with_negative: honour `is_impossible` (SQuAD 2.0).
    skip_mismatched_answers: a training answer whose `answer_start` does not point at its
    `text` is an error by default; True drops such questions (the original's warning).
    Raises InputDataError naming the file and the question id for missing keys, empty
    contexts, answers that do not match, and malformed JSON.
    """
    text = read_text(input_file)
    try:
        dataset = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputDataError(f"{input_file}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    _expect(isinstance(dataset, dict) and isinstance(dataset.get("data"), list), input_file, "top level",
            'an object with a "data" list')
    examples = []
    for a, article in enumerate(dataset["data"]):
        _expect(isinstance(article, dict) and isinstance(article.get("paragraphs"), list), input_file,
                f"data[{a}]", 'an object with a "paragraphs" list')
        for p, paragraph in enumerate(article["paragraphs"]):
            where = f"data[{a}].paragraphs[{p}]"
            _expect(isinstance(paragraph, dict) and isinstance(paragraph.get("context"), str), input_file, where,
                    'a "context" string')
            _expect(isinstance(paragraph.get("qas"), list), input_file, where, 'a "qas" list')
            context = paragraph["context"]
            doc_tokens, char_to_word_offset = split_context(context)
            for q, qa in enumerate(paragraph["qas"]):
                _expect(isinstance(qa, dict) and isinstance(qa.get("id"), str), input_file, f"{where}.qas[{q}]",
                        'an object with an "id" string')
                qid = qa["id"]
                where_q = f"question {qid}"
                _expect(isinstance(qa.get("question"), str), input_file, where_q, 'a "question" string')
                _expect(doc_tokens, input_file, where_q, "a non-empty context")
                is_impossible = False
                if version_2_with_negative:
                    is_impossible = qa.get("is_impossible", False)
                    _expect(isinstance(is_impossible, bool), input_file, where_q, '"is_impossible" true or false')
                example = SquadExample(qid, qa["question"], doc_tokens, is_impossible=is_impossible)
                if is_training:
                    if is_impossible:
                        example.start_position, example.end_position, example.orig_answer_text = -1, -1, ""
                    else:
                        answers = qa.get("answers")
                        # The original demands exactly one; dev-style files list several: train on the first.
                        _expect(isinstance(answers, list) and answers, input_file, where_q,
                                'a non-empty "answers" list for training (or "is_impossible": true)')
                        answer = answers[0]
                        _expect(isinstance(answer, dict) and isinstance(answer.get("text"), str)
                                and isinstance(answer.get("answer_start"), int) and answer["text"], input_file,
                                where_q, 'an answer {"text": non-empty string, "answer_start": int}')
                        answer_text, answer_start = answer["text"], answer["answer_start"]
                        if context[answer_start: answer_start + len(answer_text)] != answer_text or answer_start < 0:
                            if skip_mismatched_answers:
                                continue
                            found = context[max(answer_start, 0): max(answer_start, 0) + len(answer_text)]
                            raise InputDataError(
                                f"{input_file}: {where_q}: answer_start {answer_start} does not point at the "
                                f"answer text {answer_text!r} (the context has {found!r} there)"
                            )
                        example.orig_answer_text = answer_text
                        example.start_position = char_to_word_offset[answer_start]
                        example.end_position = char_to_word_offset[answer_start + len(answer_text) - 1]
                examples.append(example)
    return examples


# ----------------------------------------------------------------- features
def _improve_answer_span(doc_tokens, input_start, input_end, tokenizer, orig_answer_text):
    """The tightest piece span whose text equals the tokenized answer ("(1895-1943)." -> "1895"
    when the answer is "1895"); the word-aligned span when none does."""
    tok_answer_text = " ".join(tokenizer.tokenize(orig_answer_text))
    for new_start in range(input_start, input_end + 1):
        for new_end in range(input_end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start: new_end + 1]) == tok_answer_text:
                return new_start, new_end
    return input_start, input_end


def convert_examples_to_features(
    examples: Sequence[SquadExample],
    tokenizer,
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH,
    doc_stride: int = DEFAULT_DOC_STRIDE,
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH,
    is_training: bool = False,
    pad_to_max_length: bool = True,
) -> List[SquadFeatures]:
    """Examples -> doc-stride features (see the module docstring).

    tokenizer: anything with `tokenize` (or `tokenize_batch`) and `convert_tokens_to_ids`.
    pad_to_max_length: zero-pad ids/mask/segments to `max_seq_length` (the original); False
    leaves them at the window's length for dynamic padding.
    """
    features = []
    unique_id = FIRST_UNIQUE_ID
    cached_doc = (None, None)  # questions of one paragraph share doc_tokens: word-piece it once
    for example_index, example in enumerate(examples):
        query_tokens = tokenizer.tokenize(example.question_text)[:max_query_length]
        max_tokens_for_doc = max_seq_length - len(query_tokens) - 3  # [CLS], [SEP], [SEP]
        if max_tokens_for_doc <= 0:
            raise ValueError(f"max_seq_length {max_seq_length} leaves no room for the context after a "
                             f"{len(query_tokens)}-piece question (max_query_length {max_query_length})")
        if cached_doc[0] is not example.doc_tokens:
            tok_to_orig_index, orig_to_tok_index, all_doc_tokens = [], [], []
            for i, word_pieces in enumerate(tokenize_all(tokenizer, example.doc_tokens)):
                orig_to_tok_index.append(len(all_doc_tokens))
                for sub_token in word_pieces:
                    tok_to_orig_index.append(i)
                    all_doc_tokens.append(sub_token)
            cached_doc = (example.doc_tokens, (tok_to_orig_index, orig_to_tok_index, all_doc_tokens))
        tok_to_orig_index, orig_to_tok_index, all_doc_tokens = cached_doc[1]

        tok_start_position = tok_end_position = None
        if is_training and example.is_impossible:
            tok_start_position = tok_end_position = -1
        elif is_training:
            tok_start_position = orig_to_tok_index[example.start_position]
            if example.end_position < len(example.doc_tokens) - 1:
                tok_end_position = orig_to_tok_index[example.end_position + 1] - 1
            else:
                tok_end_position = len(all_doc_tokens) - 1
            tok_start_position, tok_end_position = _improve_answer_span(
                all_doc_tokens, tok_start_position, tok_end_position, tokenizer, example.orig_answer_text
            )

        doc_spans = doc_spans_for(len(all_doc_tokens), max_tokens_for_doc, doc_stride)
        for doc_span_index, (span_start, span_length) in enumerate(doc_spans):
            tokens = ["[CLS]"] + query_tokens + ["[SEP]"]
            segment_ids = [0] * len(tokens)
            token_to_orig_map, token_is_max_context = {}, {}
            for i in range(span_length):
                split_token_index = span_start + i
                token_to_orig_map[len(tokens)] = tok_to_orig_index[split_token_index]
                token_is_max_context[len(tokens)] = check_is_max_context(doc_spans, doc_span_index, split_token_index)
                tokens.append(all_doc_tokens[split_token_index])
                segment_ids.append(1)
            tokens.append("[SEP]")
            segment_ids.append(1)
            input_ids = tokens_to_ids(tokenizer, tokens)
            input_mask = [1] * len(input_ids)
            if pad_to_max_length:
                pad = max_seq_length - len(input_ids)
                input_ids, input_mask, segment_ids = (
                    list(input_ids) + [0] * pad, input_mask + [0] * pad, segment_ids + [0] * pad)

            start_position = end_position = None
            if is_training:
                span_end = span_start + span_length - 1
                if example.is_impossible or not (span_start <= tok_start_position and tok_end_position <= span_end):
                    # No answer in this window: point at [CLS].
                    start_position = end_position = 0
                else:
                    doc_offset = len(query_tokens) + 2
                    start_position = tok_start_position - span_start + doc_offset
                    end_position = tok_end_position - span_start + doc_offset
            features.append(SquadFeatures(
                unique_id=unique_id, example_index=example_index, doc_span_index=doc_span_index,
                tokens=tokens, token_to_orig_map=token_to_orig_map, token_is_max_context=token_is_max_context,
                input_ids=list(input_ids), input_mask=input_mask, segment_ids=segment_ids,
                start_position=start_position, end_position=end_position, is_impossible=example.is_impossible,
            ))
            unique_id += 1
    return features


def features_to_arrays(features: Sequence[SquadFeatures], seq_length: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Zero-padded arrays: input_ids, input_mask, segment_ids int32 [N, S]; unique_ids int64 [N];
    start_positions, end_positions int32 [N] when the features carry them (training)."""
    out = padded_arrays(features, seq_length)
    out["unique_ids"] = np.array([f.unique_id for f in features], np.int64)
    if features and features[0].start_position is not None:
        out["start_positions"] = np.array([f.start_position for f in features], np.int32)
        out["end_positions"] = np.array([f.end_position for f in features], np.int32)
    return out


# ----------------------------------------------------------------- post-processing
def _get_best_indexes(logits, n_best_size: int) -> List[int]:
    """Indexes of the `n_best_size` largest logits, the lower index first on ties."""
    return [int(i) for i in np.argsort(-np.asarray(logits, np.float64), kind="stable")[:n_best_size]]


def _compute_softmax(scores: Sequence[float]) -> List[float]:
    if not scores:
        return []
    max_score = max(scores)
    exp_scores = [math.exp(s - max_score) for s in scores]
    total = sum(exp_scores)
    return [e / total for e in exp_scores]


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool, strip_accents: Optional[bool] = None) -> str:
    """Projects the word-piece answer `pred_text` back onto the original words `orig_text`.

    The pieces are normalised text (lower-cased, accents and spacing changed); the original
    span is whole words and may carry extra characters ("Steve Smith's" for "steve smith").
    Both are basic-tokenized, aligned character by character ignoring spaces, and the
    matching slice of `orig_text` is returned; if the alignment fails, `orig_text` itself.
    """
    def strip_spaces(text):
        ns_chars, ns_to_s_map = [], {}
        for i, c in enumerate(text):
            if c == " ":
                continue
            ns_to_s_map[len(ns_chars)] = i
            ns_chars.append(c)
        return "".join(ns_chars), ns_to_s_map

    tokenizer = BasicTokenizer(do_lower_case=do_lower_case, strip_accents=strip_accents)
    tok_text = " ".join(tokenizer.tokenize(orig_text))
    start_position = tok_text.find(pred_text)
    if start_position == -1:
        return orig_text
    end_position = start_position + len(pred_text) - 1

    orig_ns_text, orig_ns_to_s_map = strip_spaces(orig_text)
    tok_ns_text, tok_ns_to_s_map = strip_spaces(tok_text)
    if len(orig_ns_text) != len(tok_ns_text):
        return orig_text  # normalisation changed the length: no safe character alignment
    tok_s_to_ns_map = {v: k for k, v in tok_ns_to_s_map.items()}

    orig_start_position = orig_ns_to_s_map.get(tok_s_to_ns_map.get(start_position, -1))
    orig_end_position = orig_ns_to_s_map.get(tok_s_to_ns_map.get(end_position, -1))
    if orig_start_position is None or orig_end_position is None:
        return orig_text
    return orig_text[orig_start_position: orig_end_position + 1]


class _Prelim(NamedTuple):
    feature_index: int
    start_index: int
    end_index: int
    start_logit: float
    end_logit: float


class _NBest(NamedTuple):
    text: str
    start_logit: float
    end_logit: float


def compute_predictions(
    examples: Sequence[SquadExample],
    features: Sequence[SquadFeatures],
    results: Sequence[RawResult],
    n_best_size: int = DEFAULT_N_BEST_SIZE,
    max_answer_length: int = DEFAULT_MAX_ANSWER_LENGTH,
    do_lower_case: bool = True,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = DEFAULT_NULL_SCORE_DIFF_THRESHOLD,
    strip_accents: Optional[bool] = None,
):
    """Logits -> answers, as the original's write_predictions.

    Returns (predictions {qid: text}, nbest {qid: [{text, probability, start_logit,
    end_logit}]}, null_odds {qid: score_null - best_non_null} (empty unless v2.0)).
    """
    features_by_example = collections.defaultdict(list)
    for feature in features:
        features_by_example[feature.example_index].append(feature)
    result_by_id = {int(r.unique_id): r for r in results}

    all_predictions = collections.OrderedDict()
    all_nbest = collections.OrderedDict()
    null_odds = collections.OrderedDict()
    for example_index, example in enumerate(examples):
        example_features = features_by_example[example_index]
        prelim = []
        # The null answer's score is the lowest (most confident) over the windows.
        score_null = 1000000
        min_null_feature_index = 0
        null_start_logit = null_end_logit = 0.0
        for feature_index, feature in enumerate(example_features):
            if feature.unique_id not in result_by_id:
                raise ValueError(f"no model result for feature unique_id {feature.unique_id} (question {example.qas_id})")
            result = result_by_id[feature.unique_id]
            start_logits = [float(x) for x in np.asarray(result.start_logits).reshape(-1)]
            end_logits = [float(x) for x in np.asarray(result.end_logits).reshape(-1)]
            start_indexes = _get_best_indexes(start_logits, n_best_size)
            end_indexes = _get_best_indexes(end_logits, n_best_size)
            if version_2_with_negative:
                feature_null_score = start_logits[0] + end_logits[0]
                if feature_null_score < score_null:
                    score_null = feature_null_score
                    min_null_feature_index = feature_index
                    null_start_logit, null_end_logit = start_logits[0], end_logits[0]
            for start_index in start_indexes:
                for end_index in end_indexes:
                    # Skip spans that cannot be answers: outside the context (query, [CLS],
                    # [SEP], padding), not this window's max-context start, reversed or too long.
                    if start_index >= len(feature.tokens) or end_index >= len(feature.tokens):
                        continue
                    if start_index not in feature.token_to_orig_map or end_index not in feature.token_to_orig_map:
                        continue
                    if not feature.token_is_max_context.get(start_index, False):
                        continue
                    if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                        continue
                    prelim.append(_Prelim(feature_index, start_index, end_index,
                                          start_logits[start_index], end_logits[end_index]))
        if version_2_with_negative:
            prelim.append(_Prelim(min_null_feature_index, 0, 0, null_start_logit, null_end_logit))
        prelim.sort(key=lambda x: x.start_logit + x.end_logit, reverse=True)

        seen, nbest = set(), []
        for pred in prelim:
            if len(nbest) >= n_best_size:
                break
            feature = example_features[pred.feature_index]
            if pred.start_index > 0:
                tok_tokens = feature.tokens[pred.start_index: pred.end_index + 1]
                orig_doc_start = feature.token_to_orig_map[pred.start_index]
                orig_doc_end = feature.token_to_orig_map[pred.end_index]
                orig_tokens = example.doc_tokens[orig_doc_start: orig_doc_end + 1]
                # De-tokenize the word pieces.
                tok_text = " ".join(tok_tokens).replace(" ##", "").replace("##", "")
                tok_text = " ".join(tok_text.strip().split())
                final_text = get_final_text(tok_text, " ".join(orig_tokens), do_lower_case, strip_accents)
                if final_text in seen:
                    continue
            else:
                final_text = ""
            seen.add(final_text)
            nbest.append(_NBest(final_text, pred.start_logit, pred.end_logit))

        if version_2_with_negative and "" not in seen:
            nbest.append(_NBest("", null_start_logit, null_end_logit))
        if not nbest:
            # v1.1 without any valid span (rare: e.g. max_answer_length smaller than every
            # candidate). The original's placeholder, kept so outputs stay comparable.
            nbest.append(_NBest("empty", 0.0, 0.0))

        probs = _compute_softmax([e.start_logit + e.end_logit for e in nbest])
        best_non_null = next((e for e in nbest if e.text), None)
        all_nbest[example.qas_id] = [
            collections.OrderedDict(
                [("text", e.text), ("probability", p), ("start_logit", e.start_logit), ("end_logit", e.end_logit)]
            )
            for e, p in zip(nbest, probs, strict=True)
        ]
        if not version_2_with_negative:
            all_predictions[example.qas_id] = nbest[0].text
        elif best_non_null is None:
            # Only the null answer survived: the original crashed here.
            null_odds[example.qas_id] = NULL_ODDS_WITHOUT_SPAN
            all_predictions[example.qas_id] = ""
        else:
            score_diff = score_null - best_non_null.start_logit - best_non_null.end_logit
            null_odds[example.qas_id] = score_diff
            all_predictions[example.qas_id] = "" if score_diff > null_score_diff_threshold else best_non_null.text
    return all_predictions, all_nbest, null_odds


PREDICTIONS_FILE = "predictions.json"
NBEST_FILE = "nbest_predictions.json"
NULL_ODDS_FILE = "null_odds.json"


def write_prediction_files(
    output_dir: str, predictions, nbest, null_odds, version_2_with_negative: bool = False
) -> Dict[str, str]:
    """Writes predictions.json, nbest_predictions.json and, for v2.0, null_odds.json atomically
    (JSON indented by 4, as the original); returns {file name: path}."""
    written = {}
    outputs = [(PREDICTIONS_FILE, predictions), (NBEST_FILE, nbest)]
    if version_2_with_negative:
        outputs.append((NULL_ODDS_FILE, null_odds))
    for name, value in outputs:
        path = os.path.join(output_dir, name)
        write_text_atomic(path, json.dumps(value, indent=4) + "\n")
        written[name] = path
    return written
