"""Sentence(-pair) classification and regression: GLUE, XNLI and your own TSV/CSV files.

A task is a `TaskSpec`: its labels (None = regression), its metric and, per split,
which file holds it and which columns to read (docs/reference.md §7). `get_task(name)`
returns the spec of a GLUE task or XNLI; `user_task(...)` describes your own files.

  spec = get_task("mrpc")
  train = spec.read_examples(data_dir, "train")                      # [InputExample]
  feats = convert_examples_to_features(train, spec.labels, 128, tokenizer)
  arrays = features_to_arrays(feats)                                 # {"input_ids": int32[N, S], ...}
  metrics = spec.compute_metrics(predictions, label_ids)
  write_glue_submission(output_dir, spec, "test", test_examples, predictions)

Features follow the original's layout `[CLS] A [SEP] B [SEP]` (segment 0 up to and
including the first [SEP]); a pair too long for `max_seq_length` is truncated one
token at a time from the end of the longer side (`truncate_seq_pair`), or with
`convert_examples_to_windows` cut into stride windows (over text_b for pairs, text_a whole in each).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from bert_tf.errors import InputDataError
from bert_tf.fileio import write_text_atomic
from bert_tf.tasks import padded_arrays, read_text
from bert_tf.tasks.metrics import compute_metrics
from bert_tf.tasks.windows import doc_spans_for

Column = Union[int, str]  # a position (files without a header) or a header name

SPLITS = ("train", "dev", "test")


@dataclasses.dataclass(frozen=True)
class InputExample:
    """One sentence or sentence pair. `label` is a label string, a float (regression) or None (test)."""

    guid: str
    text_a: str
    text_b: Optional[str] = None
    label: Optional[Union[str, float]] = None
    index: Optional[str] = None  # the test file's `index`/`id`, used in GLUE submission files


@dataclasses.dataclass(frozen=True)
class InputFeatures:
    """Token ids of one example. Lists are unpadded unless `pad_to_max_length` was set.

    input_ids, input_mask, segment_ids: int lists of the same length (<= max_seq_length).
    label_id: int class id, float target (regression), or 0 for unlabeled test examples.
    is_real_example: False only for padding examples added to fill a fixed-size batch.
    """

    input_ids: List[int]
    input_mask: List[int]
    segment_ids: List[int]
    label_id: Union[int, float]
    is_real_example: bool = True


# ----------------------------------------------------------------- file layouts
@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a split's fields are: header names when `header`, else 0-based column positions."""

    header: bool
    text_a: Column
    text_b: Optional[Column] = None
    label: Optional[Column] = None  # None: the split has no labels (test files)
    index: Optional[Column] = None
    label_map: Tuple[Tuple[str, str], ...] = ()  # file label -> task label (XNLI's "contradictory")
    keep_if: Optional[Tuple[Column, str]] = None  # only rows whose column equals the value (XNLI language)
    delimiter: str = "\t"


@dataclasses.dataclass(frozen=True)
class Split:
    name: str
    filename: str  # relative to data_dir
    layout: Layout
    submission: Optional[str] = None  # GLUE submission file for test splits, e.g. "MNLI-m.tsv"


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """A classification or regression task: labels, metric, and how to read each split.

    labels: the label strings in id order, or None for regression (label_id is a float).
    metric: "accuracy", "f1_accuracy" (MRPC, QQP), "mcc" (CoLA), "pearson_spearman" (STS-B).
    eval_splits / test_splits: the split names a runner evaluates / predicts (MNLI has two each).
    """

    name: str
    labels: Optional[Tuple[str, ...]]
    metric: str
    splits: Tuple[Split, ...]
    eval_splits: Tuple[str, ...] = ("dev",)
    test_splits: Tuple[str, ...] = ("test",)

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Output units of the head: the number of labels, or 1 for regression."""
        return 1 if self.labels is None else len(self.labels)

    def split(self, name: str) -> Split:
        for split in self.splits:
            if split.name == name:
                return split
        raise ValueError(f"task {self.name} has no split {name!r} (it has {', '.join(s.name for s in self.splits)})")

    def read_examples(self, data_dir: str, split: str) -> List[InputExample]:
        """The examples of `split` ("train", "dev", "test", "dev_matched", ...) from `data_dir`."""
        s = self.split(split)
        return read_examples(os.path.join(data_dir, s.filename), s.layout, self.labels, guid_prefix=split)

    def compute_metrics(self, predictions, label_ids) -> Dict[str, float]:
        """This task's official metric(s). predictions: class ids [N] or floats [N] (regression)."""
        return compute_metrics(self.metric, predictions, label_ids)


def _glue(name, labels, metric, text_a, text_b, label, *, test_index="index", test_text=None, **kw) -> TaskSpec:
    """A GLUE task whose train/dev/test files have a header and the usual names."""
    test_text = test_text or (text_a, text_b)
    labeled = Layout(header=True, text_a=text_a, text_b=text_b, label=label)
    test = Layout(header=True, text_a=test_text[0], text_b=test_text[1], index=test_index)
    splits = (
        Split("train", "train.tsv", labeled),
        Split("dev", "dev.tsv", labeled),
        Split("test", "test.tsv", test, submission=kw.pop("submission", None)),
    )
    return TaskSpec(name, labels, metric, splits, **kw)


_NLI_LABELS = ("contradiction", "entailment", "neutral")
_ENTAILMENT = ("entailment", "not_entailment")
_BINARY = ("0", "1")


def _mnli(name: str, dev: str, test: str, submission: str) -> TaskSpec:
    labeled = Layout(header=True, text_a="sentence1", text_b="sentence2", label="gold_label")
    test_layout = Layout(header=True, text_a="sentence1", text_b="sentence2", index="index")
    m = "MNLI-m.tsv"
    mm = "MNLI-mm.tsv"
    return TaskSpec(
        name,
        _NLI_LABELS,
        "accuracy",
        (
            Split("train", "train.tsv", labeled),
            Split("dev", f"{dev}.tsv", labeled),
            Split("test", f"{test}.tsv", test_layout, submission=submission),
            Split("dev_matched", "dev_matched.tsv", labeled),
            Split("dev_mismatched", "dev_mismatched.tsv", labeled),
            Split("test_matched", "test_matched.tsv", test_layout, submission=m),
            Split("test_mismatched", "test_mismatched.tsv", test_layout, submission=mm),
        ),
        eval_splits=("dev_matched", "dev_mismatched") if name == "mnli" else ("dev",),
        test_splits=("test_matched", "test_mismatched") if name == "mnli" else ("test",),
    )


def _cola() -> TaskSpec:
    # train/dev: no header; columns source, label, original mark, sentence. test: header "index sentence".
    labeled = Layout(header=False, text_a=3, label=1)
    test = Layout(header=True, text_a="sentence", index="index")
    return TaskSpec(
        "cola",
        _BINARY,
        "mcc",
        (Split("train", "train.tsv", labeled), Split("dev", "dev.tsv", labeled),
         Split("test", "test.tsv", test, submission="CoLA.tsv")),
    )


def _ax() -> TaskSpec:
    # The diagnostic set: test only, predicted by an MNLI-trained model (same labels).
    test = Layout(header=True, text_a="sentence1", text_b="sentence2", index="index")
    return TaskSpec("ax", _NLI_LABELS, "accuracy", (Split("test", "ax.tsv", test, submission="AX.tsv"),),
                    eval_splits=())


def xnli_task(language: str = "zh") -> TaskSpec:
    """XNLI in one language, laid out as the original expects it under data_dir:
    `multinli/multinli.train.<language>.tsv` (premise, hypo, label; "contradictory" means
    contradiction) and `xnli.dev.tsv` / `xnli.test.tsv` (all languages; rows of `language` kept).
    """
    train = Layout(header=True, text_a="premise", text_b="hypo", label="label",
                   label_map=(("contradictory", "contradiction"),))
    evaluation = Layout(header=True, text_a="sentence1", text_b="sentence2", label="gold_label",
                        keep_if=("language", language))
    return TaskSpec(
        "xnli",
        _NLI_LABELS,
        "accuracy",
        (Split("train", f"multinli/multinli.train.{language}.tsv", train),
         Split("dev", "xnli.dev.tsv", evaluation), Split("test", "xnli.test.tsv", evaluation)),
        test_splits=(),  # xnli.test.tsv carries labels: evaluate it with split "test"
    )


GLUE_TASKS: Dict[str, TaskSpec] = {
    "cola": _cola(),
    "sst-2": _glue("sst-2", _BINARY, "accuracy", "sentence", None, "label", submission="SST-2.tsv"),
    "mrpc": _glue("mrpc", _BINARY, "f1_accuracy", "#1 String", "#2 String", "Quality", submission="MRPC.tsv"),
    "sts-b": _glue("sts-b", None, "pearson_spearman", "sentence1", "sentence2", "score", submission="STS-B.tsv"),
    "qqp": _glue("qqp", _BINARY, "f1_accuracy", "question1", "question2", "is_duplicate", test_index="id",
                 submission="QQP.tsv"),
    "mnli": _mnli("mnli", "dev_matched", "test_matched", "MNLI-m.tsv"),
    "mnli-mm": _mnli("mnli-mm", "dev_mismatched", "test_mismatched", "MNLI-mm.tsv"),
    "qnli": _glue("qnli", _ENTAILMENT, "accuracy", "question", "sentence", "label", submission="QNLI.tsv"),
    "rte": _glue("rte", _ENTAILMENT, "accuracy", "sentence1", "sentence2", "label", submission="RTE.tsv"),
    "wnli": _glue("wnli", _BINARY, "accuracy", "sentence1", "sentence2", "label", submission="WNLI.tsv"),
    "ax": _ax(),
}


def task_names() -> List[str]:
    return sorted(GLUE_TASKS) + ["xnli"]


def get_task(task_name: str, xnli_language: str = "zh") -> TaskSpec:
    """The spec of a GLUE task or XNLI by name, case- and dash-insensitive ("MRPC", "sst2", "STS-B")."""
    key = task_name.lower().replace("_", "-")
    if key == "xnli":
        return xnli_task(xnli_language)
    aliases = {name.replace("-", ""): name for name in GLUE_TASKS}
    key = aliases.get(key.replace("-", ""), key)
    if key not in GLUE_TASKS:
        raise ValueError(f"unknown task_name {task_name!r}; expected one of {', '.join(task_names())}")
    return GLUE_TASKS[key]


def user_task(
    text_a: str,
    label: str,
    text_b: Optional[str] = None,
    labels: Optional[Sequence[str]] = None,
    regression: bool = False,
    index: Optional[str] = None,
    file_format: str = "tsv",
    name: str = "user",
    metric: Optional[str] = None,
) -> TaskSpec:
    """Your own data, no code: `train`/`dev`/`test` .tsv or .csv files with a header row.

    text_a / text_b / label / index: header names of the columns. `labels`: the label set
    in id order (None: `infer_labels` on the train file gives it). `regression`: the label
    is a number and the metric is Pearson/Spearman. The test file may lack the label column.
    TSV is read without quoting (as GLUE); CSV with standard double-quote quoting.
    """
    if file_format not in ("tsv", "csv"):
        raise ValueError(f"file_format must be 'tsv' or 'csv', got {file_format!r}")
    if regression and labels:
        raise ValueError("a regression task has no label set")
    delimiter = "\t" if file_format == "tsv" else ","
    labeled = Layout(header=True, text_a=text_a, text_b=text_b, label=label, index=index, delimiter=delimiter)
    test = Layout(header=True, text_a=text_a, text_b=text_b, index=index, delimiter=delimiter)
    metric = metric or ("pearson_spearman" if regression else "accuracy")
    splits = (
        Split("train", f"train.{file_format}", labeled),
        Split("dev", f"dev.{file_format}", labeled),
        Split("test", f"test.{file_format}", test),
    )
    return TaskSpec(name, None if regression else tuple(labels or ()), metric, splits)


def infer_labels(spec: TaskSpec, data_dir: str, split: str = "train") -> TaskSpec:
    """`spec` with its label set read from `split`: the distinct labels, in numeric order when
    every label is a number, else in string order. Regression specs come back unchanged."""
    if spec.is_regression or spec.labels:
        return spec
    s = spec.split(split)
    path = os.path.join(data_dir, s.filename)
    rows = _read_rows(path, s.layout)
    found = sorted({fields[s.layout.label].strip() for _, fields in rows})
    if not found:
        raise InputDataError(f"{path}: no examples to take the label set from")
    try:
        found.sort(key=float)
    except ValueError:
        pass
    return dataclasses.replace(spec, labels=tuple(found))


# ----------------------------------------------------------------- reading
def _read_rows(path: str, layout: Layout) -> List[Tuple[int, dict]]:
    """(line number, {column: value}) for each data row; columns keyed by header name or position."""
    text = read_text(path)
    if layout.delimiter == "\t":
        # GLUE files are not quoted: a '"' is text (the original reads with quotechar=None).
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=layout.delimiter)
    rows = []
    header = None
    try:
        for fields in reader:
            line = reader.line_num
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue  # blank lines
            if layout.header and header is None:
                header = [h.strip() for h in fields]
                needed = [c for c in (layout.text_a, layout.text_b, layout.label, layout.index) if c is not None]
                if layout.keep_if:
                    needed.append(layout.keep_if[0])
                missing = [c for c in needed if c not in header]
                if missing:
                    raise InputDataError(
                        f"{path}:{line}: header has no column {missing[0]!r} (expected columns "
                        f"{', '.join(repr(c) for c in needed)}; found {', '.join(repr(h) for h in header)})"
                    )
                continue
            if header is not None:
                if len(fields) != len(header):
                    raise InputDataError(
                        f"{path}:{line}: expected {len(header)} {_delimiter_name(layout)}-separated columns "
                        f"as in the header, found {len(fields)}"
                    )
                rows.append((line, dict(zip(header, fields, strict=True))))
            else:
                needed = max(c for c in (layout.text_a, layout.text_b, layout.label, layout.index) if c is not None)
                if len(fields) <= needed:
                    raise InputDataError(
                        f"{path}:{line}: expected at least {needed + 1} {_delimiter_name(layout)}-separated "
                        f"columns, found {len(fields)}"
                    )
                rows.append((line, dict(enumerate(fields))))
    except csv.Error as e:
        raise InputDataError(f"{path}:{reader.line_num}: malformed {_delimiter_name(layout)} row ({e})") from None
    if layout.header and header is None:
        raise InputDataError(f"{path}: empty file (expected a header row)")
    return rows


def _delimiter_name(layout: Layout) -> str:
    return "tab" if layout.delimiter == "\t" else repr(layout.delimiter)


def read_examples(
    path: str, layout: Layout, labels: Optional[Sequence[str]], guid_prefix: str = "ex"
) -> List[InputExample]:
    """Reads one split file. `labels` None means regression (labels parsed as floats).

    Raises InputDataError (file:line: what was expected) for wrong column counts, missing
    header columns, labels outside `labels`, non-numeric regression targets and bad UTF-8.
    """
    label_map = dict(layout.label_map)
    allowed = set(labels) if labels else None
    examples = []
    for line, row in _read_rows(path, layout):
        if layout.keep_if and row[layout.keep_if[0]] != layout.keep_if[1]:
            continue
        label = None
        if layout.label is not None:
            raw = row[layout.label].strip()
            if labels is None:
                try:
                    label = float(raw)
                except ValueError:
                    raise InputDataError(f"{path}:{line}: expected a number as the label, found {raw!r}") from None
                if not math.isfinite(label):
                    raise InputDataError(f"{path}:{line}: expected a finite number as the label, found {raw!r}")
            else:
                label = label_map.get(raw, raw)
                if allowed is not None and label not in allowed:
                    raise InputDataError(
                        f"{path}:{line}: unknown label {raw!r} (expected one of {', '.join(labels)})"
                    )
        index = row[layout.index].strip() if layout.index is not None else None
        examples.append(
            InputExample(
                guid=f"{guid_prefix}-{len(examples)}",
                text_a=row[layout.text_a],
                text_b=row[layout.text_b] if layout.text_b is not None else None,
                label=label,
                index=index,
            )
        )
    return examples


# ----------------------------------------------------------------- features
def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """Truncates the pair in place to at most `max_length` tokens in total, one token at a time
    from the end of the longer list (of `tokens_b` on ties). This keeps more of a short
    sentence than cutting both by the same fraction would (the original's rule)."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def tokenize_all(tokenizer, texts: Sequence[str]) -> List[List[str]]:
    """Word pieces of each text, through the tokenizer's batch path when it has one."""
    if hasattr(tokenizer, "tokenize_batch"):
        return [list(t) for t in tokenizer.tokenize_batch(list(texts))]
    return [tokenizer.tokenize(t) for t in texts]


def tokens_to_ids(tokenizer, tokens: Sequence[str]) -> List[int]:
    """Vocabulary ids of `tokens`: `convert_tokens_to_ids`, or the `vocab` dict of tokenizers without it."""
    if hasattr(tokenizer, "convert_tokens_to_ids"):
        return list(tokenizer.convert_tokens_to_ids(tokens))
    return [tokenizer.vocab[t] for t in tokens]


def pair_to_ids(tokenizer, tokens_a: list, tokens_b: Optional[list], max_seq_length: int):
    """`[CLS] A [SEP] (B [SEP])` -> (input_ids, segment_ids), truncating to max_seq_length.

    Mutates tokens_a / tokens_b (truncation)."""
    if tokens_b is not None:
        truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)  # [CLS], [SEP], [SEP]
    elif len(tokens_a) > max_seq_length - 2:  # [CLS], [SEP]
        del tokens_a[max_seq_length - 2:]
    tokens = ["[CLS]"] + tokens_a + ["[SEP]"]
    segment_ids = [0] * len(tokens)
    if tokens_b is not None:
        tokens += tokens_b + ["[SEP]"]
        segment_ids += [1] * (len(tokens_b) + 1)
    return tokens_to_ids(tokenizer, tokens), segment_ids


def _label_id(example: InputExample, label_to_id: Optional[Dict[str, int]], labels) -> Union[int, float]:
    """The id of the example's label (its float target for regression; 0 when unlabeled)."""
    if example.label is None:
        return 0.0 if label_to_id is None else 0
    if label_to_id is None:
        return float(example.label)
    if example.label not in label_to_id:
        raise InputDataError(f"example {example.guid}: unknown label {example.label!r} "
                            f"(expected one of {', '.join(labels)})")
    return label_to_id[example.label]


def _tokenize_examples(examples: Sequence[InputExample], tokenizer):
    """(word pieces of every text_a, {example position: word pieces of its text_b})."""
    pieces_a = tokenize_all(tokenizer, [e.text_a for e in examples])
    with_b = [i for i, e in enumerate(examples) if e.text_b is not None]
    pieces_b = dict(zip(with_b, tokenize_all(tokenizer, [examples[i].text_b for i in with_b]), strict=True))
    return pieces_a, pieces_b


def _features(input_ids, segment_ids, label_id, max_seq_length: int, pad_to_max_length: bool) -> InputFeatures:
    input_mask = [1] * len(input_ids)
    if pad_to_max_length:
        pad = max_seq_length - len(input_ids)
        input_ids, input_mask, segment_ids = input_ids + [0] * pad, input_mask + [0] * pad, segment_ids + [0] * pad
    return InputFeatures(list(input_ids), input_mask, list(segment_ids), label_id)


def convert_examples_to_features(
    examples: Sequence[InputExample],
    labels: Optional[Sequence[str]],
    max_seq_length: int,
    tokenizer,
    pad_to_max_length: bool = False,
) -> List[InputFeatures]:
    """Examples -> features. `labels` None = regression (label_id is the float target).

    tokenizer: anything with `tokenize` (or `tokenize_batch`) and `convert_tokens_to_ids` (or `vocab`).
    Unpadded by default so the runner can batch by length; `pad_to_max_length` zero-pads
    every feature to `max_seq_length` (fixed shapes, TPU).
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3, got {max_seq_length}")
    label_to_id = {label: i for i, label in enumerate(labels)} if labels is not None else None
    pieces_a, pieces_b = _tokenize_examples(examples, tokenizer)
    features = []
    for i, example in enumerate(examples):
        input_ids, segment_ids = pair_to_ids(tokenizer, pieces_a[i], pieces_b.get(i), max_seq_length)
        features.append(_features(input_ids, segment_ids, _label_id(example, label_to_id, labels), max_seq_length,
                                  pad_to_max_length))
    return features


def convert_examples_to_windows(
    examples: Sequence[InputExample],
    labels: Optional[Sequence[str]],
    max_seq_length: int,
    tokenizer,
    doc_stride: int,
    pad_to_max_length: bool = False,
) -> Tuple[List[InputFeatures], List[int]]:
    """Examples -> every window of every example, instead of one truncated feature each.

    A single text longer than `max_seq_length - 2` pieces becomes windows `[CLS] piece-span [SEP]`
    starting `doc_stride` pieces apart (bert_tf.tasks.windows.doc_spans_for, as SQuAD's context);
    in a pair, the windows run over text_b and every window holds the whole text_a, as SQuAD's
    question: `[CLS] A [SEP] B-span [SEP]`. An example that fits is one window, the same feature
    convert_examples_to_features makes. Every window carries its example's label.
    Returns (features in example order, the example index of each feature). A text_a that
    leaves no room for text_b is a InputDataError.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3, got {max_seq_length}")
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be positive, got {doc_stride}")
    label_to_id = {label: i for i, label in enumerate(labels)} if labels is not None else None
    pieces_a, pieces_b = _tokenize_examples(examples, tokenizer)
    features, window_example = [], []
    for i, example in enumerate(examples):
        label_id = _label_id(example, label_to_id, labels)
        if i in pieces_b:
            fixed, windowed, room = pieces_a[i], pieces_b[i], max_seq_length - len(pieces_a[i]) - 3
            if room < 1:
                raise InputDataError(
                    f"example {example.guid}: text_a has {len(fixed)} word pieces, which leaves no room for text_b "
                    f"in max_seq_length {max_seq_length} (windows run over text_b and repeat text_a whole): put "
                    "the long text in text_b or raise --max_seq_length")
        else:
            fixed, windowed, room = None, pieces_a[i], max_seq_length - 2
        for start, length in doc_spans_for(len(windowed), room, doc_stride) or [(0, 0)]:
            span = windowed[start:start + length]
            a, b = (span, None) if fixed is None else (list(fixed), span)
            input_ids, segment_ids = pair_to_ids(tokenizer, a, b, max_seq_length)
            features.append(_features(input_ids, segment_ids, label_id, max_seq_length, pad_to_max_length))
            window_example.append(i)
    return features, window_example


def padding_features(count: int, max_seq_length: int, regression: bool = False) -> List[InputFeatures]:
    """`count` all-zero features with is_real_example=False, to fill the last fixed-size batch (TPU)."""
    zeros = [0] * max_seq_length
    return [InputFeatures(zeros, zeros, zeros, 0.0 if regression else 0, False) for _ in range(count)]


def features_to_arrays(features: Sequence[InputFeatures], seq_length: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Stacks features into zero-padded arrays.

    Returns input_ids, input_mask, segment_ids: int32 [N, S] with S = `seq_length` or the
    longest feature; label_ids: int32 [N] (float32 [N] for regression); is_real_example: int32 [N].
    """
    out = padded_arrays(features, seq_length)
    regression = any(isinstance(f.label_id, float) for f in features)
    out["label_ids"] = np.array([f.label_id for f in features], np.float32 if regression else np.int32)
    out["is_real_example"] = np.array([int(f.is_real_example) for f in features], np.int32)
    return out


# ----------------------------------------------------------------- output files
def glue_submission_text(spec: TaskSpec, examples: Sequence[InputExample], predictions) -> str:
    """The GLUE submission TSV: `index<TAB>prediction` per test example, after a header line.

    predictions: class ids [N] (written as label strings) or floats [N] (regression, "%.3f").
    """
    if len(predictions) != len(examples):
        raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples")
    lines = ["index\tprediction"]
    for i, (example, prediction) in enumerate(zip(examples, predictions, strict=True)):
        index = example.index if example.index is not None else str(i)
        value = f"{float(prediction):.3f}" if spec.is_regression else spec.labels[int(prediction)]
        lines.append(f"{index}\t{value}")
    return "\n".join(lines) + "\n"


def write_glue_submission(output_dir: str, spec: TaskSpec, split: str, examples, predictions) -> str:
    """Writes `<output_dir>/<TASK>.tsv` (CoLA.tsv, MNLI-m.tsv, AX.tsv, ...) atomically; returns its path."""
    name = spec.split(split).submission or f"{spec.name}.tsv"
    path = os.path.join(output_dir, name)
    write_text_atomic(path, glue_submission_text(spec, examples, predictions))
    return path


def test_results_text(probabilities) -> str:
    """The original's `test_results.tsv`: one line of tab-separated class probabilities per example."""
    return "".join("\t".join(str(float(p)) for p in np.atleast_1d(row)) + "\n" for row in np.asarray(probabilities))

