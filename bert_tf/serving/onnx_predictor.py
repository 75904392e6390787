"""Answers raw text with an ONNX export (bert_tf.serving.onnx_export) as the SavedModel's serving_default does.

`OnnxServe(export_dir, metadata)(**inputs)` takes the inputs of the export type's serving_default
(text_a/text_b, question/context, context/choices, text; lists of strings) and returns its outputs
(the same names, values and shapes, as numpy), so predict.py and the Beam pipeline treat both alike:
  1. tokenize in Python with FullTokenizer's rules (bert_tf.tokenization.FastTokenizer, the same ids);
  2. pack as the SavedModel's graph does (bert_tf.serving.tokenizer.pack_pair: [CLS] A [SEP] (B [SEP]),
     the original's longest-first truncation), padded to the batch's longest row, not max_seq_length;
  3. run model.onnx in ONNX Runtime;
  4. read the answer out as the serving modules do (label, best span, one tag per word), per-position
     outputs zero-padded back to max_seq_length.
Imports numpy, onnxruntime and bert_tf.tokenization only: no TensorFlow on a local export.

Dimensions: N rows, C choices, T the batch's longest row, S max_seq_length, L labels, H hidden.
"""

from __future__ import annotations

import os
from typing import Dict, List, Sequence, Tuple

import numpy as np
import onnxruntime

from bert_tf.serving.formats import ONNX_FILE
from bert_tf.tasks.glue import truncate_seq_pair
from bert_tf.tokenization.fast import FastTokenizer

HUB_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")  # bert_tf.serving.module's (it imports TensorFlow)
# ONNX Runtime session settings (measured on a shared 2-core SPR-AMX Xeon, benchmarks/RESULTS.md, 2026-11-27):
# - denormals as zero: a padded batch's masked attention scores (-10000) make MLAS's softmax exp produce
#   denormals, 3-8x slower without flush-to-zero (TensorFlow flushes them too);
# - spinning idle intra-op threads (ONNX Runtime's default) where the cores are the server's own: MiniLM int8
#   batch-1 p50 2.8 ms with it against 4.7 without, on a quiet machine; on a machine shared with other work
#   spinning takes the cores from the thread doing the work (10.6 ms with, 6.2 without, under load 4-9 on 2
#   cores): BERT_TF_ORT_SPINNING=0 lets idle threads sleep.
SESSION_CONFIG = {"session.set_denormal_as_zero": "1", "session.intra_op.allow_spinning": "1"}
SPINNING_ENV = "BERT_TF_ORT_SPINNING"


def session_config(environ=None) -> dict:
    """SESSION_CONFIG with spinning as SPINNING_ENV sets it ("0": off; unset or anything else: on)."""
    environ = os.environ if environ is None else environ
    spinning = "0" if environ.get(SPINNING_ENV, "").strip() == "0" else "1"
    return dict(SESSION_CONFIG, **{"session.intra_op.allow_spinning": spinning})


def _read_bytes(path: str) -> bytes:
    if "://" in path:
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def pack_rows(rows: Sequence[Tuple[List[int], List[int]]], cls_id: int, sep_id: int) -> Dict[str, np.ndarray]:
    """(A ids, B ids) already truncated -> int32 [N, T] TF-Hub inputs; an empty B is the one-text layout."""
    width = max(len(a) + 2 + (len(b) + 1 if b else 0) for a, b in rows)
    packed = {name: np.zeros((len(rows), width), np.int32) for name in HUB_INPUTS}
    for i, (a, b) in enumerate(rows):
        ids = [cls_id, *a, sep_id] + ([*b, sep_id] if b else [])
        packed["input_word_ids"][i, :len(ids)] = ids
        packed["input_mask"][i, :len(ids)] = 1
        packed["input_type_ids"][i, len(a) + 2:len(ids)] = 1
    return packed


def truncated(a: List[int], b: List[int], seq_length: int) -> Tuple[List[int], List[int]]:
    """The original's truncation: a pair longest first to seq_length - 3, one text to seq_length - 2."""
    if not b:
        return a[:seq_length - 2], []
    a, b = list(a), list(b)
    truncate_seq_pair(a, b, seq_length - 3)
    return a, b


def pad_positions(x: np.ndarray, length: int) -> np.ndarray:
    """[N, T, ...] -> [N, length, ...], zeros after T (the SavedModel's per-position output shape)."""
    pad = [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    return np.pad(x, pad)


def _strings(values) -> np.ndarray:
    """UTF-8 bytes as the SavedModel returns strings (rows_of decodes them)."""
    return np.array([v.encode("utf-8") for v in values], dtype=object)


class OnnxServe:
    """model.onnx of an export, its tokenizer and its task's read-out; call it like serving_default."""

    def __init__(self, export_dir: str, metadata: dict, intra_op_threads: int = 0):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        for key, value in session_config().items():
            options.add_session_config_entry(key, value)
        self.session = onnxruntime.InferenceSession(_read_bytes(os.path.join(export_dir, ONNX_FILE)), options,
                                                    providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        vocab_file = os.path.join(export_dir, "assets", "vocab.txt")
        local = vocab_file
        if "://" in vocab_file:  # FastTokenizer reads a local file
            import tempfile

            local = os.path.join(tempfile.mkdtemp(prefix="onnx-vocab-"), "vocab.txt")
            with open(local, "wb") as f:
                f.write(_read_bytes(vocab_file))
        tok = metadata["tokenizer"]
        self.tokenizer = FastTokenizer(local, do_lower_case=tok["do_lower_case"], strip_accents=tok["strip_accents"])
        # id -> token by line, as the SavedModel's id_to_token table (the export made duplicate lines unique)
        self.id_to_token = _read_bytes(vocab_file).decode("utf-8").split("\n")
        self.cls_id, self.sep_id = self.tokenizer.vocab["[CLS]"], self.tokenizer.vocab["[SEP]"]
        self.kind = metadata["export_type"]
        self.metadata = metadata
        self.seq = int(metadata["max_seq_length"])
        self.labels = metadata.get("label_list")

    def run(self, packed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """The model on int32 TF-Hub inputs: {output name: float32 array}."""
        return dict(zip(self.output_names, self.session.run(None, packed), strict=True))

    def __call__(self, **inputs) -> Dict[str, np.ndarray]:
        return getattr(self, f"_{self.kind}")(**inputs)

    def _pairs(self, text_a, text_b):
        ids = self.tokenizer.encode_batch(list(text_a) + list(text_b))
        n = len(text_a)
        return pack_rows([truncated(a, b, self.seq) for a, b in zip(ids[:n], ids[n:], strict=True)], self.cls_id,
                         self.sep_id)

    def _classification(self, text_a, text_b):
        out = self.run(self._pairs(text_a, text_b))
        label_id = out["logits"].argmax(-1)
        return {"probabilities": out["probabilities"], "logits": out["logits"], "label_id": label_id,
                "label": _strings([self.labels[i] for i in label_id])}

    def _regression(self, text_a, text_b):
        return {"score": self.run(self._pairs(text_a, text_b))["score"]}

    def _encoder(self, text_a, text_b):
        out = self.run(self._pairs(text_a, text_b))
        return {k: v if k == "pooled_output" else pad_positions(v, self.seq) for k, v in out.items()}

    def _multiple_choice(self, context, choices):
        n, c = len(choices), len(choices[0])
        flat = self._pairs([x for x in context for _ in range(c)], [y for row in choices for y in row])  # [N * C, T]
        out = self.run({k: v.reshape(n, c, -1) for k, v in flat.items()})  # [N, C, T] in
        return {"probabilities": out["probabilities"], "logits": out["logits"], "choice": out["logits"].argmax(-1)}

    def _span(self, question, context):
        """The best span as SpanServing: start + end logits over context positions, end - start < max_answer_length."""
        ids = self.tokenizer.encode_batch(list(question) + list(context))
        n, limit = len(question), self.metadata["max_query_length"]
        rows = []
        for q, c in zip(ids[:n], ids[n:], strict=True):
            q = q[:limit]
            rows.append((q, c[:max(self.seq - 3 - len(q), 0)]))
        packed = pack_rows(rows, self.cls_id, self.sep_id)
        out = self.run(packed)
        seq = self.seq
        start, end = (pad_positions(out[k], seq) for k in ("start_logits", "end_logits"))  # [N, S]
        hub = {k: pad_positions(v, seq) for k, v in packed.items()}
        positions = np.arange(seq)[None, :]
        last = hub["input_mask"].sum(1, keepdims=True) - 1  # [N, 1]: the final [SEP]
        in_context = (hub["input_type_ids"] == 1) & (positions < last)  # [N, S]
        offset = positions[0][None, :] - positions[0][:, None]  # [S, S]: end - start
        allowed = ((offset >= 0) & (offset < self.metadata["max_answer_length"]))[None]
        allowed = allowed & in_context[:, :, None] & in_context[:, None, :]  # [N, S, S]
        scores = np.where(allowed, start[:, :, None] + end[:, None, :], np.finfo(np.float32).min).reshape(n, -1)
        best = scores.argmax(1)
        has_span = in_context.any(1)
        a_start, a_end = np.where(has_span, best // seq, 0), np.where(has_span, best % seq, 0)
        score = np.where(has_span, scores[np.arange(n), best], 0.0).astype(np.float32)
        texts = []
        for i in range(n):
            pieces = [self.id_to_token[t] for t in hub["input_word_ids"][i, a_start[i]:a_end[i] + 1]] if has_span[i] \
                else []
            texts.append(" ".join(pieces).replace(" ##", ""))
        return {"start_logits": start, "end_logits": end, "answer_start": a_start.astype(np.int32),
                "answer_end": a_end.astype(np.int32), "answer_score": score, "answer_text": _strings(texts)}

    def _tagging(self, text):
        """One tag per word from its first wordpiece, as TaggingServing; words whose first piece is cut are dropped."""
        words = self.tokenizer.basic_tokenize_batch(list(text))
        rows, firsts = [], []
        for row in words:
            pieces = self.tokenizer.word_ids(row)
            starts = np.cumsum([0] + [len(p) for p in pieces])[:-1] + 1  # after [CLS]
            firsts.append([int(s) for s in starts if s <= self.seq - 2])
            rows.append(truncated([i for p in pieces for i in p], [], self.seq))
        out = self.run(pack_rows(rows, self.cls_id, self.sep_id))
        logits = out["logits"]  # [N, T, L]
        n, width, num_labels = len(text), self.seq, logits.shape[-1]
        result = {"words": np.full((n, width), b"", dtype=object), "tags": np.full((n, width), b"", dtype=object),
                  "probabilities": np.zeros((n, width, num_labels), np.float32),
                  "num_words": np.array([len(f) for f in firsts], np.int32)}
        for i, first in enumerate(firsts):
            k = len(first)
            result["words"][i, :k] = _strings(words[i][:k])
            result["tags"][i, :k] = _strings([self.labels[j] for j in logits[i, first].argmax(-1)])
            result["probabilities"][i, :k] = out["probabilities"][i, first]
        return result
