"""Answers rows of text with an export (a SavedModel, or ONNX): what predict.py runs, one process or many (Beam).

A SavedModel needs only TensorFlow and tensorflow_text (for the tokenizer ops) at run time, nothing else
of bert_tf. An ONNX export (model.onnx) runs in ONNX Runtime with the Python tokenizer beside it
(bert_tf.serving.onnx_predictor), which answers with the same outputs as the SavedModel's serving_default.

Inputs: one text per line, text<TAB>text_b, or JSON Lines ({"text": ..., "text_b": ...}; files
ending in .jsonl or .json). Multiple choice takes its choices in text_b separated by "|" (or as a
JSON list).
"""

from __future__ import annotations

import json
import os
from typing import Iterator, List, Tuple

from bert_tf.errors import ExportError
from bert_tf.serving.formats import METADATA_FILE, ONNX_FILE, ONNX_FORMAT

CHOICE_SEPARATOR = "|"
JSONL_SUFFIXES = (".jsonl", ".json", ".jsonl.gz")
Row = Tuple[str, str]


PredictError = ExportError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


def _open_text(path: str):
    if "://" in path:
        import tensorflow as tf

        return tf.io.gfile.GFile(path, "r")
    if not os.path.isfile(path):
        raise ExportError(f"{path}: input_file not found")
    return open(path, encoding="utf-8")


def _jsonl_row(path: str, number: int, line: str) -> Row:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}:{number}: not a JSON line ({e.msg})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise ExportError(f"{path}:{number}: expected a JSON object with a \"text\" string")
    b = obj.get("text_b", "")
    if isinstance(b, list):
        b = CHOICE_SEPARATOR.join(map(str, b))
    if not isinstance(b, str):
        raise ExportError(f"{path}:{number}: \"text_b\" must be a string or a list of strings")
    return obj["text"], b


def iter_rows(path: str) -> Iterator[Row]:
    """(text, text_b) for every non-blank line of a text, TSV or JSON Lines file, in order."""
    jsonl = path.endswith(JSONL_SUFFIXES)
    with _open_text(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            if jsonl:
                yield _jsonl_row(path, number, line)
                continue
            parts = line.split("\t")
            if len(parts) > 2:
                raise ExportError(f"{path}:{number}: expected text or text<TAB>text_b, got {len(parts)} columns")
            yield parts[0], parts[1] if len(parts) == 2 else ""


def check_export(export_dir: str) -> str:
    """The path of the export's metadata file; ExportError when export_dir is not one of our exports."""
    metadata_file = os.path.join(export_dir, "assets", METADATA_FILE)
    models = [os.path.join(export_dir, name) for name in ("saved_model.pb", ONNX_FILE)]
    if "://" in export_dir:  # gs:// and other TensorFlow file systems
        import tensorflow as tf

        try:
            found = tf.io.gfile.exists(metadata_file) and any(tf.io.gfile.exists(p) for p in models)
        except tf.errors.OpError as e:
            reason = " ".join(e.message.split()).split(" when reading")[0].split("error details: ")[-1]
            raise ExportError(f"{export_dir}: cannot reach or read it ({reason[:200]})") from None
    else:
        found = os.path.isfile(metadata_file) and any(os.path.isfile(p) for p in models)
    if not found:
        raise ExportError(f"{export_dir}: not a SavedModel or ONNX export written by export_savedmodel.py")
    return metadata_file


def _read_metadata(metadata_file: str) -> dict:
    if "://" in metadata_file:
        import tensorflow as tf

        with tf.io.gfile.GFile(metadata_file, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    with open(metadata_file, encoding="utf-8") as f:
        return json.load(f)


def load(export_dir: str):
    """(serve, export metadata) of an export (SavedModel or ONNX, float or int8): serve(**inputs) takes
    serving_default's inputs as lists of strings and returns its outputs as numpy arrays."""
    metadata = _read_metadata(check_export(export_dir))
    if metadata.get("format") == ONNX_FORMAT:
        try:
            from bert_tf.serving.onnx_predictor import OnnxServe  # lazy: onnxruntime is an optional extra
        except ImportError as e:
            raise ExportError(f"{export_dir} is an ONNX export; serving it needs {e.name}: "
                               'pip install -e ".[onnx]"') from None
        return OnnxServe(export_dir, metadata), metadata
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)

    signature = tf.saved_model.load(export_dir).signatures["serving_default"]

    def serve(**inputs):
        return {k: v.numpy() for k, v in signature(**{k: tf.constant(v) for k, v in inputs.items()}).items()}

    return serve, metadata


def run_batch(serve, kind, metadata, batch: List[Row]):
    a = [x for x, _ in batch]
    b = [y for _, y in batch]
    if kind == "span":
        return serve(question=a, context=b)
    if kind == "multiple_choice":
        n = metadata["num_choices"]
        choices = [y.split(CHOICE_SEPARATOR) for y in b]
        if any(len(c) != n for c in choices):
            raise ExportError(f"multiple choice: every input needs {n} choices separated by {CHOICE_SEPARATOR!r}")
        return serve(context=a, choices=choices)
    if kind == "tagging":
        return serve(text=a)
    return serve(text_a=a, text_b=b)


def rows_of(kind, metadata, out, batch: List[Row]):
    """One dict per input with the answer in plain Python types."""
    for i, (a, b) in enumerate(batch):
        row = {"text": a}
        if b:
            row["text_b"] = b
        if kind == "classification":
            row["label"] = out["label"][i].decode("utf-8")
            row["probabilities"] = dict(zip(metadata["label_list"], map(float, out["probabilities"][i]), strict=True))
        elif kind == "regression":
            row["score"] = float(out["score"][i])
        elif kind == "span":
            row["answer"] = out["answer_text"][i].decode("utf-8")
            row["score"] = float(out["answer_score"][i])
        elif kind == "multiple_choice":
            row["choice"] = int(out["choice"][i])
            row["probabilities"] = [float(p) for p in out["probabilities"][i]]
        elif kind == "tagging":
            n = int(out["num_words"][i])
            row["words"] = [w.decode("utf-8") for w in out["words"][i][:n]]
            row["tags"] = [t.decode("utf-8") for t in out["tags"][i][:n]]
        else:  # encoder
            row["pooled_output"] = [float(x) for x in out["pooled_output"][i]]
        yield row


def json_line(row) -> str:
    """A row as predict.py --format=json prints it (and the Beam pipeline writes it)."""
    return json.dumps(row, ensure_ascii=False)


class Predictor:
    """A loaded export that turns a list of rows into JSON lines, `batch_size` rows per call."""

    def __init__(self, export_dir: str, batch_size: int = 32):
        self.serve, self.metadata = load(export_dir)
        self.kind = self.metadata["export_type"]
        self.batch_size = batch_size

    def lines(self, rows: List[Row]) -> List[str]:
        out: List[str] = []
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start:start + self.batch_size]
            result = run_batch(self.serve, self.kind, self.metadata, batch)
            out.extend(json_line(r) for r in rows_of(self.kind, self.metadata, result, batch))
        return out
