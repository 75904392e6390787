"""SavedModels that serve raw text, self-contained (vocab inside), loadable with tensorflow + tensorflow_text.

Also the one place that turns a fine-tuned model_dir back into its task model
(`build_task_model`, `restore_model_dir`), shared by the runners and the export.

Model-directory contract: bert_config.json, vocab.txt, bert_tf_info.json
(do_lower_case, max_seq_length, task_type, label_list, num_choices) and
`ckpt-<step>` checkpoints of tf.train.Checkpoint(model=<task model>, ...).

Dimensions: B batch, C choices, S max_seq_length, L labels, H hidden.

Every export has the signatures
  serving_default  raw strings (see each module below), tokenized in the graph;
  serve_ids        int32 [B, S] (multiple choice: [B, C, S]) input_word_ids,
                   input_mask, input_type_ids, the TF-Hub names;
  preprocess       the raw-string inputs -> those three int32 tensors;
and carries assets/vocab.txt and assets/bert_tf_export.json (metadata: task,
labels, casing, max_seq_length, tokenizer facts and known differences).

`quantize="int8"` exports the same signatures with the Transformer blocks' dense
layers in dynamic int8 (bert_tf.serving.quantize; the metadata says
"quantization": "int8-dynamic" and how). It serves on x86 TensorFlow builds with
oneDNN (the pip wheels), which have the int8 kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from typing import Optional

import tensorflow as tf

from bert_tf import fileio
from bert_tf.configs import RUN_INFO_FILE, BertConfig, ConfigError, read_run_info
from bert_tf.serving import quantize as quantization
from bert_tf.serving.tokenizer import (
    InGraphTokenizer,
    pack_pair,
    unicode_differences,
)
from bert_tf.tokenization.full import load_vocab

TASK_TYPES = ("classification", "regression", "span", "multiple_choice", "tagging", "pretraining")
EXPORT_TYPES = ("encoder",) + TASK_TYPES[:-1]
METADATA_FILE = "bert_tf_export.json"
METADATA_VERSION = 1
# SQuAD defaults of the original run_squad.py (docs/reference.md §7).
DEFAULT_MAX_QUERY_LENGTH = 64
DEFAULT_MAX_ANSWER_LENGTH = 30
HUB_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")


class ExportError(ValueError):
    """A model_dir, checkpoint or export_dir that cannot be used; the message is one line."""


# ------------------------------------------------------------------ model_dir -> task model
def build_task_model(config: BertConfig, info: dict):
    """The (freshly initialised) task model that `info["task_type"]` names, built from `config`.

    classification: BertClassifier(len(label_list)); regression: BertClassifier(1);
    span: BertSpanLabeler; multiple_choice: BertMultipleChoice(num_choices);
    tagging: BertTokenClassifier(len(label_list)); pretraining: BertPretrainer.
    """
    from bert_tf.models import (
        BertClassifier,
        BertEncoder,
        BertMultipleChoice,
        BertPretrainer,
        BertSpanLabeler,
        BertTokenClassifier,
    )

    causal = bool(info.get("causal_attention", False))  # a left-to-right (--objective=ltr) encoder

    def encoder():
        return BertEncoder(config, causal=causal)

    task = info.get("task_type")
    if task not in TASK_TYPES:
        raise ExportError(f"{RUN_INFO_FILE}: task_type {task!r}; expected one of {', '.join(TASK_TYPES)}")
    if task in ("classification", "tagging"):
        labels = info.get("label_list")
        if not isinstance(labels, list) or not labels:
            raise ExportError(f"{RUN_INFO_FILE}: label_list must be a non-empty list of str for task_type {task}")
    if task == "classification":
        return BertClassifier(encoder(), num_labels=len(info["label_list"]))
    if task == "regression":
        return BertClassifier(encoder(), num_labels=1)
    if task == "span":
        return BertSpanLabeler(encoder())
    if task == "multiple_choice":
        num_choices = info.get("num_choices")
        if not isinstance(num_choices, int) or num_choices < 2:
            raise ExportError(f"{RUN_INFO_FILE}: num_choices must be an int >= 2 for task_type multiple_choice")
        return BertMultipleChoice(encoder(), num_choices=num_choices)
    if task == "tagging":
        return BertTokenClassifier(encoder(), num_labels=len(info["label_list"]))
    return BertPretrainer(config)


def latest_checkpoint(model_dir: str) -> str:
    """The newest `ckpt-<step>` prefix in model_dir (the `checkpoint` state file first, else the highest step)."""
    latest = tf.train.latest_checkpoint(model_dir)
    if latest:
        return latest
    steps = []
    for index in tf.io.gfile.glob(os.path.join(model_dir, "ckpt-*.index")):
        m = re.fullmatch(r"ckpt-(\d+)\.index", os.path.basename(index))
        if m:
            steps.append(int(m.group(1)))
    if not steps:
        raise ExportError(f"{model_dir}: no ckpt-<step> checkpoint found")
    return os.path.join(model_dir, f"ckpt-{max(steps)}")


def read_model_dir(model_dir: str):
    """(BertConfig, run info dict) of a model_dir, with one-line errors for missing pieces."""
    _check_remote(model_dir)  # (isdir would call an unreachable bucket "not found")
    if not tf.io.gfile.isdir(model_dir):
        raise ExportError(f"{model_dir}: model_dir not found")
    config_file = os.path.join(model_dir, "bert_config.json")
    if not tf.io.gfile.exists(config_file):
        raise ExportError(f"{config_file}: not found (a model_dir needs bert_config.json, vocab.txt, {RUN_INFO_FILE})")
    info_file = os.path.join(model_dir, RUN_INFO_FILE)
    if not tf.io.gfile.exists(info_file):
        raise ExportError(f"{info_file}: not found (written by the fine-tuning runners)")
    try:
        info = read_run_info(model_dir)
    except json.JSONDecodeError as e:
        raise ExportError(f"{info_file}: not valid JSON ({e})") from None
    for key, kind in (("do_lower_case", bool), ("max_seq_length", int)):
        if not isinstance(info.get(key), kind):
            raise ExportError(f"{info_file}: {key} must be a {kind.__name__}")
    return BertConfig.from_json_file(config_file), info


def restore_model_dir(model_dir: str, checkpoint: Optional[str] = None):
    """The task model of a fine-tuned model_dir with the weights of its latest (or the given) checkpoint.

    Optimizer slots and the step in the checkpoint are ignored; every model
    variable must be found there.
    """
    config, info = read_model_dir(model_dir)
    model = build_task_model(config, info)
    path = checkpoint or latest_checkpoint(model_dir)
    try:
        status = tf.train.Checkpoint(model=model).read(path)
        status.expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        first = str(e).strip().splitlines()[0][:300]
        raise ExportError(f"{path}: does not match the {info['task_type']} model of bert_config.json ({first})") from None
    return model


# ------------------------------------------------------------------ serving modules
def _string_spec(name, shape=(None,)):
    return tf.TensorSpec(list(shape), tf.string, name=name)


def _ids_specs(rank=2):
    return {name: tf.TensorSpec([None] * rank, tf.int32, name=name) for name in HUB_INPUTS}


def _our_names(hub: dict) -> dict:
    """TF-Hub input names -> the encoder's (docs/reference.md §8 and docs/design.md's one vocabulary)."""
    return {"input_ids": hub["input_word_ids"], "input_mask": hub["input_mask"], "segment_ids": hub["input_type_ids"]}


class _Serving(tf.Module):
    """Tokenizer + model + packing; subclasses add the task outputs and signatures.

    kept_variables=None (float32): the module tracks the model and the serving functions call
    it. A list (int8, see bert_tf.serving.quantize): only those variables are saved (not the
    float kernels the int8 constants replace), and every signature calls one traced forward
    pass, so the int8 constants are stored once.
    """

    ids_rank = 2  # of the model's int32 inputs: [B, S] (multiple choice: [B, C, S])

    def __init__(self, model, tokenizer: InGraphTokenizer, max_seq_length: int, metadata_file: str,
                 kept_variables=None):
        super().__init__()
        if kept_variables is None:
            self.model = model
            self._forward = None
        else:
            # Named by their Keras paths (layer_0.attention_LayerNorm.gamma, ...).
            named = {}
            for v in kept_variables:
                name = getattr(v, "path", v.name).replace("/", ".").replace(":", "_")
                named[name if name not in named else f"{name}_{len(named)}"] = v
            self.float_variables = named
            spec = {name: tf.TensorSpec([None] * self.ids_rank, tf.int32)
                    for name in ("input_ids", "input_mask", "segment_ids")}
            self._forward = tf.function(lambda features: model(features, training=False), input_signature=[spec],
                                        autograph=False)
        self.tokenizer = tokenizer
        self.max_seq_length = int(max_seq_length)
        self.metadata = tf.saved_model.Asset(metadata_file)
        self._cls_id = tokenizer.lookup("[CLS]")
        self._sep_id = tokenizer.lookup("[SEP]")

    def _model(self, features):
        if self._forward is None:
            return self.model(features, training=False)
        return self._forward({k: tf.cast(v, tf.int32) for k, v in features.items()})

    def _pack(self, text_a, text_b):
        """string [N], [N] -> int32 [N, S] TF-Hub inputs; text_b "" means one segment."""
        # One tokenizer pass over A and B together (half the graph, one op launch each).
        ids = self.tokenizer.tokenize(tf.concat([text_a, text_b], axis=0))  # [2N, (T)]
        n = tf.shape(text_a)[0]
        ids_a, ids_b = ids[:n], ids[n:]
        return pack_pair(ids_a, ids_b, self.max_seq_length, self._cls_id, self._sep_id)

    def signatures(self) -> dict:
        raise NotImplementedError


class EncoderServing(_Serving):
    """serving_default(text_a, text_b [B] string) / serve_ids(TF-Hub ids) ->
    pooled_output [B, H], sequence_output [B, S, H], encoder_outputs, encoder_outputs_1, ... [B, S, H]."""

    def _outputs(self, hub):
        out = self._model(_our_names(hub))
        result = {"pooled_output": tf.cast(out["pooled_output"], tf.float32),
                  "sequence_output": tf.cast(out["sequence_output"], tf.float32)}
        for i, layer in enumerate(out["encoder_outputs"]):
            result["encoder_outputs" if i == 0 else f"encoder_outputs_{i}"] = tf.cast(layer, tf.float32)
        return result

    @tf.function(autograph=False, input_signature=[_string_spec("text_a"), _string_spec("text_b")])
    def serve_text(self, text_a, text_b):
        return self._outputs(self._pack(text_a, text_b))

    @tf.function(autograph=False, input_signature=[_ids_specs()])
    def serve_ids(self, inputs):
        return self._outputs(inputs)

    @tf.function(autograph=False, input_signature=[_ids_specs()])
    def __call__(self, inputs):
        """The TF-Hub calling convention: dict in, dict out with encoder_outputs as a list."""
        out = self._model(_our_names(inputs))
        return {"pooled_output": out["pooled_output"], "sequence_output": out["sequence_output"],
                "encoder_outputs": list(out["encoder_outputs"])}

    @tf.function(autograph=False, input_signature=[_string_spec("text_a"), _string_spec("text_b")])
    def preprocess(self, text_a, text_b):
        return self._pack(text_a, text_b)

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}


class ClassifierServing(_Serving):
    """serving_default(text_a, text_b [B] string; text_b "" for one text) ->
    probabilities float32 [B, L], label string [B], label_id int64 [B], logits [B, L];
    regression: score float32 [B]."""

    def __init__(self, model, tokenizer, max_seq_length, metadata_file, label_list=None, kept_variables=None):
        super().__init__(model, tokenizer, max_seq_length, metadata_file, kept_variables)
        self.regression = label_list is None
        self._labels = None if self.regression else tf.constant(list(label_list))

    def _outputs(self, hub):
        logits = tf.cast(self._model(_our_names(hub)), tf.float32)  # [B, L]
        if self.regression:
            return {"score": logits[:, 0]}
        label_id = tf.argmax(logits, axis=-1)
        return {"probabilities": tf.nn.softmax(logits, axis=-1), "logits": logits,
                "label_id": label_id, "label": tf.gather(self._labels, label_id)}

    @tf.function(autograph=False, input_signature=[_string_spec("text_a"), _string_spec("text_b")])
    def serve_text(self, text_a, text_b):
        return self._outputs(self._pack(text_a, text_b))

    @tf.function(autograph=False, input_signature=[_string_spec("text")])
    def serve_single(self, text):
        return self._outputs(self._pack(text, tf.fill(tf.shape(text), "")))

    @tf.function(autograph=False, input_signature=[_ids_specs()])
    def serve_ids(self, inputs):
        return self._outputs(inputs)

    @tf.function(autograph=False, input_signature=[_string_spec("text_a"), _string_spec("text_b")])
    def preprocess(self, text_a, text_b):
        return self._pack(text_a, text_b)

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_text": self.serve_single,
                "serve_ids": self.serve_ids, "preprocess": self.preprocess}


class SpanServing(_Serving):
    """serving_default(question, context [B] string) -> start_logits, end_logits float32 [B, S],
    answer_start, answer_end int32 [B] (token positions, inclusive), answer_score float32 [B],
    answer_text string [B] (the answer's wordpieces joined: lower-cased for uncased models).

    One window per question: the question is cut to max_query_length pieces and
    the context to what remains of max_seq_length (no doc_stride windows)."""

    def __init__(self, model, tokenizer, max_seq_length, metadata_file,
                 max_query_length=DEFAULT_MAX_QUERY_LENGTH, max_answer_length=DEFAULT_MAX_ANSWER_LENGTH,
                 kept_variables=None):
        super().__init__(model, tokenizer, max_seq_length, metadata_file, kept_variables)
        self.max_query_length = int(max_query_length)
        self.max_answer_length = int(max_answer_length)

    def _pack_qa(self, question, context):
        ids = self.tokenizer.tokenize(tf.concat([question, context], axis=0))  # [2N, (T)]
        n = tf.shape(question)[0]
        q, c = ids[:n], ids[n:]
        len_q = tf.minimum(q.row_lengths(), self.max_query_length)
        len_c = tf.minimum(c.row_lengths(), self.max_seq_length - 3 - len_q)
        return pack_pair(q, c, self.max_seq_length, self._cls_id, self._sep_id, len_a=len_q, len_b=len_c)

    def _outputs(self, hub):
        out = self._model(_our_names(hub))
        start, end = tf.cast(out["start_logits"], tf.float32), tf.cast(out["end_logits"], tf.float32)  # [B, S]
        seq = tf.shape(start)[1]
        positions = tf.range(seq)[None, :]  # [1, S]
        last = tf.reduce_sum(hub["input_mask"], axis=1, keepdims=True) - 1  # [B, 1]: the final [SEP]
        in_context = tf.logical_and(tf.equal(hub["input_type_ids"], 1), positions < last)  # [B, S]
        offset = positions[0][None, :] - positions[0][:, None]  # [S, S]: end - start
        allowed = tf.logical_and(offset >= 0, offset < self.max_answer_length)[None]  # [1, S, S]
        allowed = allowed & in_context[:, :, None] & in_context[:, None, :]  # [B, S, S]
        scores = start[:, :, None] + end[:, None, :]  # [B, S, S]
        scores = tf.where(allowed, scores, tf.float32.min)
        best = tf.argmax(tf.reshape(scores, [-1, seq * seq]), axis=1, output_type=tf.int32)  # [B]
        a_start, a_end = best // seq, best % seq
        has_span = tf.reduce_any(in_context, axis=1)
        a_start = tf.where(has_span, a_start, 0)
        a_end = tf.where(has_span, a_end, 0)
        score = tf.where(has_span, tf.gather(tf.reshape(scores, [-1, seq * seq]), best, batch_dims=1), 0.0)
        take = tf.logical_and(positions >= a_start[:, None], positions <= a_end[:, None]) & has_span[:, None]
        pieces = self.tokenizer.id_to_token.lookup(tf.cast(hub["input_word_ids"], tf.int64))  # [B, S]
        joined = tf.strings.reduce_join(tf.where(take, pieces, ""), axis=1, separator=" ")
        joined = tf.strings.strip(tf.strings.regex_replace(joined, " +", " "))
        text = tf.strings.regex_replace(joined, " ##", "")
        return {"start_logits": start, "end_logits": end, "answer_start": a_start, "answer_end": a_end,
                "answer_score": score, "answer_text": text}

    @tf.function(autograph=False, input_signature=[_string_spec("question"), _string_spec("context")])
    def serve_text(self, question, context):
        return self._outputs(self._pack_qa(question, context))

    @tf.function(autograph=False, input_signature=[_ids_specs()])
    def serve_ids(self, inputs):
        out = self._model(_our_names(inputs))
        return {"start_logits": tf.cast(out["start_logits"], tf.float32),
                "end_logits": tf.cast(out["end_logits"], tf.float32)}

    @tf.function(autograph=False, input_signature=[_string_spec("question"), _string_spec("context")])
    def preprocess(self, question, context):
        return self._pack_qa(question, context)

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}


class MultipleChoiceServing(_Serving):
    """serving_default(context string [B], choices string [B, C]) ->
    probabilities float32 [B, C], logits [B, C], choice int64 [B]. Each choice
    is packed as [CLS] context [SEP] choice [SEP] (SWAG: choice = sent2 + " " + ending)."""

    ids_rank = 3

    def __init__(self, model, tokenizer, max_seq_length, metadata_file, num_choices, kept_variables=None):
        super().__init__(model, tokenizer, max_seq_length, metadata_file, kept_variables)
        self.num_choices = int(num_choices)

    def _pack_choices(self, context, choices):
        flat_context = tf.reshape(tf.repeat(context[:, None], self.num_choices, axis=1), [-1])  # [B * C]
        hub = self._pack(flat_context, tf.reshape(choices, [-1]))  # [B * C, S]
        return {k: tf.reshape(v, [-1, self.num_choices, self.max_seq_length]) for k, v in hub.items()}  # [B, C, S]

    def _outputs(self, hub):
        logits = tf.cast(self._model(_our_names(hub)), tf.float32)  # [B, C]
        return {"probabilities": tf.nn.softmax(logits, axis=-1), "logits": logits,
                "choice": tf.argmax(logits, axis=-1)}

    @tf.function(autograph=False, input_signature=[_string_spec("context"), _string_spec("choices", (None, None))])
    def serve_text(self, context, choices):
        return self._outputs(self._pack_choices(context, choices))

    @tf.function(autograph=False, input_signature=[_ids_specs(rank=3)])
    def serve_ids(self, inputs):
        return self._outputs(inputs)

    @tf.function(autograph=False, input_signature=[_string_spec("context"), _string_spec("choices", (None, None))])
    def preprocess(self, context, choices):
        return self._pack_choices(context, choices)

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}


class TaggingServing(_Serving):
    """serving_default(text string [B]) -> words string [B, S] and tags string [B, S] ("" padding),
    num_words int32 [B]. A word's tag is the one predicted on its first wordpiece (the paper's
    CoNLL setup); words past max_seq_length - 2 pieces are dropped. serve_ids -> logits [B, S, L],
    tag (per position) string [B, S]."""

    def __init__(self, model, tokenizer, max_seq_length, metadata_file, label_list, kept_variables=None):
        super().__init__(model, tokenizer, max_seq_length, metadata_file, kept_variables)
        self._labels = tf.constant(list(label_list))

    def _predict(self, hub):
        logits = tf.cast(self._model(_our_names(hub)), tf.float32)  # [B, S, L]
        return logits, tf.argmax(logits, axis=-1, output_type=tf.int32)  # [B, S]

    @tf.function(autograph=False, input_signature=[_string_spec("text")])
    def serve_text(self, text):
        words = self.tokenizer.words(text)  # [B, (W)]
        pieces = self.tokenizer.wordpieces(words)  # [B, (W), (P)]
        ids = pieces.merge_dims(-2, -1)  # [B, (T)]
        hub = pack_pair(ids, ids[:, :0], self.max_seq_length, self._cls_id, self._sep_id)
        _, predicted = self._predict(hub)
        counts = pieces.row_lengths(axis=2)  # [B, (W)]
        first = tf.math.cumsum(counts, axis=1, exclusive=True) + 1  # [B, (W)]: after [CLS]
        # A word survives if its first piece does; survivors are a prefix of each row.
        num_words = tf.reduce_sum(tf.cast(first <= self.max_seq_length - 2, tf.int32), axis=1)  # [B]
        shape = [None, self.max_seq_length]
        first = first.to_tensor(0, shape=shape)  # [B, S]
        valid = tf.range(self.max_seq_length)[None, :] < num_words[:, None]  # [B, S]
        tags = tf.gather(self._labels, tf.gather(predicted, tf.cast(first, tf.int32), batch_dims=1))  # [B, S]
        return {"words": tf.where(valid, words.to_tensor("", shape=shape), ""),
                "tags": tf.where(valid, tags, ""), "num_words": num_words}

    @tf.function(autograph=False, input_signature=[_ids_specs()])
    def serve_ids(self, inputs):
        logits, predicted = self._predict(inputs)
        return {"logits": logits, "tag": tf.gather(self._labels, predicted)}

    @tf.function(autograph=False, input_signature=[_string_spec("text")])
    def preprocess(self, text):
        return self._pack(text, tf.fill(tf.shape(text), ""))

    def signatures(self):
        return {"serving_default": self.serve_text, "serve_ids": self.serve_ids, "preprocess": self.preprocess}


# ------------------------------------------------------------------ metadata and the export itself
def tokenizer_metadata(do_lower_case: bool, strip_accents: Optional[bool]) -> dict:
    """What the in-graph tokenizer does, and where it can differ from FullTokenizer."""
    import unicodedata

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


def _write_vocab_asset(vocab_file: str, folder: str) -> str:
    """vocab.txt with stripped lines (the original's lookup), one token per id; duplicates made unique."""
    vocab = load_vocab(vocab_file)
    for token in ("[UNK]", "[CLS]", "[SEP]"):
        if token not in vocab:
            raise ExportError(f"{vocab_file}: vocab has no {token} token")
    size = max(vocab.values()) + 1
    tokens = [f"[bert_tf unused duplicate {i}]" for i in range(size)]
    for token, index in vocab.items():
        tokens[index] = token
    if any("\n" in t for t in tokens):
        raise ExportError(f"{vocab_file}: a token contains a line break")
    path = os.path.join(folder, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return path


def check_quantize(quantize: Optional[str]) -> Optional[str]:
    """None / "none" -> None (float32); "int8" -> "int8" once the runtime is known to run int8; else ExportError."""
    if quantize is None or quantize == "none":
        return None
    if quantize not in quantization.QUANTIZE_MODES:
        raise ExportError(f"quantize {quantize!r}; expected none or {', '.join(quantization.QUANTIZE_MODES)}")
    try:
        quantization.check_int8_runtime()
    except quantization.QuantizationError as e:
        raise ExportError(str(e)) from None
    return quantize


def _check_remote(path: str) -> None:
    try:
        fileio.check_remote(path)
    except fileio.RemotePathError as e:
        raise ExportError(str(e)) from None


def _check_export_dir(export_dir: str, overwrite: bool) -> None:
    _check_remote(export_dir)
    if tf.io.gfile.exists(export_dir):
        if not tf.io.gfile.isdir(export_dir):
            raise ExportError(f"{export_dir}: export_dir exists and is not a directory")
        if tf.io.gfile.listdir(export_dir) and not overwrite:
            raise ExportError(f"{export_dir}: export_dir exists and is not empty; pass --overwrite to replace it")


def export_serving_model(
    model,
    export_type: str,
    export_dir: str,
    vocab_file: str,
    do_lower_case: bool,
    max_seq_length: int,
    strip_accents: Optional[bool] = None,
    label_list=None,
    num_choices: Optional[int] = None,
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH,
    max_answer_length: int = DEFAULT_MAX_ANSWER_LENGTH,
    overwrite: bool = False,
    quantize: Optional[str] = None,
    int8_weight_scale: str = "channel",
) -> str:
    """Writes a self-contained SavedModel of `model` (an encoder or a task model) to export_dir.

    export_type: "encoder" or a task type (classification, regression, span,
    multiple_choice, tagging). The export is written to a temporary sibling and
    renamed into place at the end. Returns export_dir.

    quantize: None (float32, the model as it is) or "int8": the Transformer blocks'
    dense layers run as dynamic int8 (bert_tf.serving.quantize; x86 TensorFlow with
    oneDNN, at export and serving), the rest float32. int8_weight_scale: "channel"
    (one int8 scale per output column) or "tensor" (one per matrix; less accurate).
    """
    if export_type not in EXPORT_TYPES:
        raise ExportError(f"task_type {export_type!r} cannot be exported; expected one of {', '.join(EXPORT_TYPES)}")
    quantize = check_quantize(quantize)
    if quantize and int8_weight_scale not in quantization.WEIGHT_SCALES:
        raise ExportError(f"int8_weight_scale {int8_weight_scale!r}; expected one of "
                          f"{', '.join(quantization.WEIGHT_SCALES)}")
    if label_list is not None:
        label_list = [str(label) for label in label_list]
    _check_export_dir(export_dir, overwrite)
    encoder = getattr(model, "encoder", model)
    if max_seq_length > encoder.config.max_position_embeddings:
        raise ExportError(f"max_seq_length {max_seq_length} exceeds max_position_embeddings "
                          f"{encoder.config.max_position_embeddings} of bert_config.json")
    if export_type == "span" and max_seq_length <= max_query_length + 3:
        raise ExportError(f"max_seq_length {max_seq_length} leaves no room for a context after "
                          f"max_query_length {max_query_length}")
    if quantize and encoder.compute_dtype != "float32":
        raise ExportError(f"int8 export quantizes a float32 model; this one computes in {encoder.compute_dtype}")

    export_dir = export_dir.rstrip("/")
    parent = os.path.dirname(os.path.abspath(export_dir))
    tf.io.gfile.makedirs(parent)
    staging = tempfile.mkdtemp(prefix=".export-assets-")
    tmp_dir = f"{export_dir}.tmp-{os.getpid()}"
    try:
        vocab_asset = _write_vocab_asset(vocab_file, staging)
        metadata = {
            "format": "bert_tf SavedModel",
            "version": METADATA_VERSION,
            "export_type": export_type,
            "max_seq_length": int(max_seq_length),
            "label_list": label_list,
            "num_choices": num_choices,
            "bert_config": encoder.config.to_dict(),
            "tokenizer": tokenizer_metadata(do_lower_case, strip_accents),
        }
        if export_type == "span":
            metadata.update(max_query_length=int(max_query_length), max_answer_length=int(max_answer_length))
        if quantize:
            layers = [name for name, _ in quantization.block_dense_layers(encoder)]
            metadata.update(quantization="int8-dynamic",
                            quantization_method=quantization.describe(int8_weight_scale, layers))
        metadata_file = os.path.join(staging, METADATA_FILE)
        with open(metadata_file, "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2, sort_keys=True, ensure_ascii=False)

        tokenizer = InGraphTokenizer(vocab_asset, do_lower_case=do_lower_case, strip_accents=strip_accents)
        served = encoder if export_type == "encoder" else model
        with contextlib.ExitStack() as stack:
            kept = None
            if quantize:
                # The serving functions are traced (by tf.saved_model.save) with the blocks' Dense
                # layers computing in int8; the model is back to float32 when the block ends.
                int8 = stack.enter_context(quantization.int8_dense_calls(encoder, int8_weight_scale))
                kept = [v for v in served.variables if id(v) not in int8["replaced_variables"]]
            args = (tokenizer, max_seq_length, metadata_file)
            if export_type == "encoder":
                module = EncoderServing(encoder, *args, kept_variables=kept)
            elif export_type == "classification":
                if not label_list:
                    raise ExportError("classification export needs a label_list")
                module = ClassifierServing(model, *args, label_list=label_list, kept_variables=kept)
            elif export_type == "regression":
                module = ClassifierServing(model, *args, label_list=None, kept_variables=kept)
            elif export_type == "span":
                module = SpanServing(model, *args, max_query_length=max_query_length,
                                     max_answer_length=max_answer_length, kept_variables=kept)
            elif export_type == "multiple_choice":
                module = MultipleChoiceServing(model, *args, num_choices=num_choices, kept_variables=kept)
            else:
                module = TaggingServing(model, *args, label_list=label_list, kept_variables=kept)

            if tf.io.gfile.exists(tmp_dir):
                tf.io.gfile.rmtree(tmp_dir)
            tf.saved_model.save(module, tmp_dir, signatures=module.signatures())
        if tf.io.gfile.exists(export_dir):
            tf.io.gfile.rmtree(export_dir)  # only reached when empty or overwrite was asked for
        tf.io.gfile.rename(tmp_dir, export_dir)
    except quantization.QuantizationError as e:
        raise ExportError(str(e)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if tf.io.gfile.exists(tmp_dir):
            tf.io.gfile.rmtree(tmp_dir)
    return export_dir


def export_model_dir(model_dir: str, export_dir: str, export_type: Optional[str] = None,
                     max_seq_length: Optional[int] = None, overwrite: bool = False,
                     quantize: Optional[str] = None, **kwargs) -> str:
    """Exports a fine-tuned model_dir (the contract above); export_type "encoder" exports its encoder only.

    A pretraining model_dir exports its encoder. max_seq_length defaults to the one trained with.
    quantize: None (float32) or "int8" (see export_serving_model).
    """
    quantize = check_quantize(quantize)
    config, info = read_model_dir(model_dir)
    _check_export_dir(export_dir, overwrite)
    vocab_file = os.path.join(model_dir, "vocab.txt")
    if not tf.io.gfile.exists(vocab_file):
        raise ExportError(f"{vocab_file}: not found")
    model = restore_model_dir(model_dir)
    task = info["task_type"]
    export_type = export_type or ("encoder" if task == "pretraining" else task)
    if export_type != "encoder" and export_type != task:
        raise ExportError(f"{model_dir}: a {task} model cannot be exported as {export_type}; use encoder or {task}")
    if "max_query_length" in info:
        kwargs.setdefault("max_query_length", info["max_query_length"])
    return export_serving_model(
        model, export_type, export_dir, vocab_file, do_lower_case=info["do_lower_case"],
        max_seq_length=max_seq_length or info["max_seq_length"], strip_accents=info.get("strip_accents"),
        label_list=info.get("label_list") if task in ("classification", "tagging") else None,
        num_choices=info.get("num_choices"), overwrite=overwrite, quantize=quantize, **kwargs)


def export_checkpoint(init_checkpoint: str, bert_config_file: Optional[str], vocab_file: Optional[str],
                      do_lower_case: bool, export_dir: str, max_seq_length: int, overwrite: bool = False,
                      quantize: Optional[str] = None) -> str:
    """Exports the encoder of a pretrained checkpoint: original TF1, Hugging Face folder/safetensors, or ours.

    bert_config_file (an original bert_config.json or a Hugging Face config.json) and vocab_file
    default to the files beside the checkpoint (`finetuning.resolve_pretrained`).
    quantize: None (float32) or "int8" (see export_serving_model).
    """
    from bert_tf.checkpoints import CheckpointError, load_pretrained
    from bert_tf.finetuning import FinetuneError, resolve_pretrained
    from bert_tf.tokenization import VocabError

    quantize = check_quantize(quantize)
    for path, what in ((bert_config_file, "bert_config_file"), (vocab_file, "vocab_file")):
        if path and not tf.io.gfile.exists(path):
            raise ExportError(f"{path}: {what} not found")
    _check_export_dir(export_dir, overwrite)
    try:
        pretrained = resolve_pretrained(init_checkpoint, bert_config_file, vocab_file)
        encoder = pretrained.build_encoder()
        load_pretrained(encoder, pretrained.init_checkpoint, pretrained.fmt)
    except (CheckpointError, ConfigError, FinetuneError, VocabError) as e:
        raise ExportError(str(e).splitlines()[0]) from None
    return export_serving_model(encoder, "encoder", export_dir, pretrained.vocab_file, do_lower_case=do_lower_case,
                                max_seq_length=max_seq_length, overwrite=overwrite, quantize=quantize)
