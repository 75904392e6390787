"""SavedModels that serve raw text, self-contained (vocab inside), loadable with tensorflow + tensorflow_text.

The model directory it reads (side files, checkpoints, the task model they
rebuild) is bert_tf.model_dir's.

`export_preprocessor` (export type "preprocessor") writes the other half of
TF-Hub's BERT workflow: strings -> the encoder's inputs, with TF-Hub's
`tokenize` and `bert_pack_inputs` (bert_tf.serving.preprocessor); the encoder
export is the fine-tunable half (a TF-Hub reusable SavedModel, encoder.py).

The export: check the request, write the vocab and the metadata as assets,
look the export type up in SERVING_MODULES (one `tf.Module` per task type in
`bert_tf/serving/`, with the signatures serving_default, serve_ids and
preprocess; `bert_tf/serving/module.py`), save it to a temporary sibling of
export_dir and rename it into place. Every export carries assets/vocab.txt and
assets/bert_tf_export.json (metadata: task, labels, casing, max_seq_length,
tokenizer facts and known differences).

`quantize="int8"` exports the same signatures with the Transformer blocks' dense
layers in dynamic int8 (bert_tf.serving.quantize; the metadata says
"quantization": "int8-dynamic" and how). It serves on x86 TensorFlow builds with
oneDNN (the pip wheels), which have the int8 kernel.

`export_format="onnx"` writes the same export types as model.onnx for ONNX Runtime instead (token ids
in, the model's float outputs out; bert_tf.serving.onnx_export), with assets/vocab.txt and
assets/bert_tf_export.json beside it; predict.py tokenizes in Python beside the session
(bert_tf.serving.onnx_predictor). quantize="int8" is then ONNX Runtime's dynamic int8.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Optional

import tensorflow as tf

from bert_tf import fileio
from bert_tf import model_dir as model_dir_lib
from bert_tf.checkpoints import load_pretrained
from bert_tf.errors import CheckpointError, ConfigError, ExportError, InputDataError, RemotePathError
from bert_tf.pretrained import resolve_pretrained
from bert_tf.serving import onnx_export
from bert_tf.serving import quantize as quantization
from bert_tf.serving.classifier import ClassifierServing, RegressionServing
from bert_tf.serving.encoder import EncoderServing
from bert_tf.serving.formats import METADATA_FILE
from bert_tf.serving.module import ServingOptions
from bert_tf.serving.multiple_choice import MultipleChoiceServing
from bert_tf.serving.preprocessor import PreprocessorServing
from bert_tf.serving.span import SpanServing
from bert_tf.serving.tagging import TaggingServing
from bert_tf.serving.tokenizer import InGraphTokenizer, tokenizer_metadata
from bert_tf.serving.windows import windowed
from bert_tf.tasks.squad import DEFAULT_MAX_ANSWER_LENGTH, DEFAULT_MAX_QUERY_LENGTH
from bert_tf.tokenization.full import load_vocab

# What serves each export type (bert_tf/serving/): "encoder", or a task type's model.
SERVING_MODULES = {
    "encoder": EncoderServing,
    "classification": ClassifierServing,
    "regression": RegressionServing,
    "span": SpanServing,
    "multiple_choice": MultipleChoiceServing,
    "tagging": TaggingServing,
}
EXPORT_TYPES = tuple(SERVING_MODULES)
# The TF-Hub BERT preprocessor (bert_tf/serving/preprocessor.py): tokenizer and packing only, no model.
PREPROCESSOR = "preprocessor"
METADATA_VERSION = 1
# What an export is written as: a SavedModel (TF Serving, TF-Hub, batch jobs) or ONNX (ONNX Runtime on CPUs).
EXPORT_FORMATS = ("savedmodel", "onnx")


# ------------------------------------------------------------------ metadata and the export itself
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


def check_format(export_format: str) -> None:
    """ExportError for an unknown format, or for "onnx" without its extra (the one line names the install)."""
    if export_format not in EXPORT_FORMATS:
        raise ExportError(f"export_format {export_format!r}; expected one of {', '.join(EXPORT_FORMATS)}")
    if export_format == "onnx":
        onnx_export.check_installed()


def check_quantize(quantize: Optional[str], export_format: str = "savedmodel") -> Optional[str]:
    """None / "none" -> None (float32); "int8" -> "int8" once the runtime is known to run int8; else ExportError."""
    if quantize is None or quantize == "none":
        return None
    if quantize not in quantization.QUANTIZE_MODES:
        raise ExportError(f"quantize {quantize!r}; expected none or {', '.join(quantization.QUANTIZE_MODES)}")
    if export_format == "onnx":
        return quantize  # ONNX Runtime's own int8 kernels
    quantization.check_int8_runtime()
    return quantize


def _check_remote(path: str) -> None:
    try:
        fileio.check_remote(path)
    except RemotePathError as e:
        raise ExportError(str(e)) from None


def _check_export_dir(export_dir: str, overwrite: bool) -> None:
    """The export folder rule (bert_tf.fileio.export_dir_problem); --overwrite lets a full folder be replaced."""
    _check_remote(export_dir)
    problem = fileio.export_dir_problem(export_dir, "export_dir", "pass --overwrite to replace it", overwrite)
    if problem:
        raise ExportError(problem)


def export_serving_model(model, export_type: str, export_dir: str, vocab_file: str, do_lower_case: bool,
                         max_seq_length: int, *, overwrite: bool = False, quantize: Optional[str] = None,
                         export_format: str = "savedmodel", **options) -> str:
    """Writes a self-contained SavedModel of `model` (an encoder or a task model) to export_dir.

    export_type: "encoder" or a task type (classification, regression, span,
    multiple_choice, tagging). The export is written to a temporary sibling and
    renamed into place at the end. Returns export_dir.

    quantize: None (float32, the model as it is) or "int8": the Transformer blocks'
    dense layers run as dynamic int8 (bert_tf.serving.quantize; x86 TensorFlow with
    oneDNN, at export and serving), the rest float32. int8_weight_scale: "channel"
    (one int8 scale per output column) or "tensor" (one per matrix; less accurate).
    windows: (doc_stride, aggregation) for a classifier or regressor trained with --long_inputs=windows:
    its text signatures window long texts in the graph and aggregate (bert_tf.serving.windows);
    (doc_stride, None) for a tagger trained with --doc_stride: each word tagged in its max-context window.
    export_format: "savedmodel" or "onnx" (model.onnx beside the same assets; quantize "int8" is ONNX Runtime's
    dynamic int8, int8_weight_scale does not apply; onnx_fusions: ONNX Runtime's fused LayerNorm and GELU ops).
    """
    check_format(export_format)
    quantize = check_quantize(quantize, export_format)
    _check_export_dir(export_dir, overwrite)
    return _write_serving_model(model, export_type, export_dir, vocab_file, do_lower_case, max_seq_length,
                                overwrite=overwrite, quantize=quantize, export_format=export_format, **options)


def _write_serving_model(
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
    windows: Optional[tuple] = None,
    export_format: str = "savedmodel",
    onnx_fusions: bool = True,
) -> str:
    """export_serving_model once its format, quantize and export folder are checked (export_model_dir and
    export_checkpoint check them before reading any weights): the checks that need the model, then the writing."""
    serving_module = SERVING_MODULES.get(export_type)
    if serving_module is None:
        raise ExportError(f"task_type {export_type!r} cannot be exported; expected one of {', '.join(EXPORT_TYPES)}")
    onnx = export_format == "onnx"
    if windows is not None and onnx:
        raise ExportError("a model trained on windows (--long_inputs=windows, --doc_stride) windows long texts in "
                          "the SavedModel's graph; the ONNX export serves one window: export a SavedModel")
    if windows is not None:
        if export_type not in ("classification", "regression", "tagging"):
            raise ExportError(f"windows apply to classification, regression and tagging exports, not {export_type}")
        try:
            serving_module = windowed(serving_module, *windows)
        except ValueError as e:
            raise ExportError(str(e)) from None
    if quantize and not onnx and int8_weight_scale not in quantization.WEIGHT_SCALES:
        raise ExportError(f"int8_weight_scale {int8_weight_scale!r}; expected one of "
                          f"{', '.join(quantization.WEIGHT_SCALES)}")
    if label_list is not None:
        label_list = [str(label) for label in label_list]
    options = ServingOptions(max_seq_length=int(max_seq_length), label_list=label_list, num_choices=num_choices,
                             max_query_length=max_query_length, max_answer_length=max_answer_length)
    encoder = getattr(model, "encoder", model)
    if max_seq_length > encoder.config.max_position_embeddings:
        raise ExportError(f"max_seq_length {max_seq_length} exceeds max_position_embeddings "
                          f"{encoder.config.max_position_embeddings} of bert_config.json")
    serving_module.check_options(options)
    if quantize and encoder.compute_dtype != "float32":
        raise ExportError(f"int8 export quantizes a float32 model; this one computes in {encoder.compute_dtype}")

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
    metadata.update(serving_module.metadata_entries(options))
    if onnx:
        metadata.update(onnx_export.metadata_entries(export_type, do_lower_case, strip_accents, quantize,
                                                     onnx_fusions))
        served = encoder if serving_module.serves_encoder else model

        def save_onnx(tmp_dir, vocab_asset, metadata_file):
            onnx_export.write_export(served, export_type, tmp_dir, [vocab_asset, metadata_file], encoder.config,
                                     serving_module.ids_rank, quantize, onnx_fusions)

        return _save_export(export_dir, vocab_file, metadata, save_onnx)

    def save(tmp_dir, vocab_asset, metadata_file):
        tokenizer = InGraphTokenizer(vocab_asset, do_lower_case=do_lower_case, strip_accents=strip_accents)
        served = encoder if serving_module.serves_encoder else model
        with contextlib.ExitStack() as stack:
            kept = None
            if quantize:
                # The serving functions are traced (by tf.saved_model.save) with the blocks' Dense
                # layers computing in int8; the model is back to float32 when the block ends.
                int8 = stack.enter_context(quantization.int8_dense_calls(encoder, int8_weight_scale))
                kept = [v for v in served.variables if id(v) not in int8["replaced_variables"]]
            module = serving_module(served, tokenizer, options, metadata_file, kept_variables=kept)
            tf.saved_model.save(module, tmp_dir, signatures=module.signatures())

    if quantize:
        layers = [name for name, _ in quantization.block_dense_layers(encoder)]
        metadata.update(quantization="int8-dynamic",
                        quantization_method=quantization.describe(int8_weight_scale, layers))
    return _save_export(export_dir, vocab_file, metadata, save)


def export_preprocessor(export_dir: str, vocab_file: str, do_lower_case: bool, seq_length: int,
                        strip_accents: Optional[bool] = None, overwrite: bool = False) -> str:
    """Writes a TF-Hub BERT preprocessor SavedModel (bert_tf.serving.preprocessor) to export_dir.

    Its default call packs one text to seq_length; bert_pack_inputs takes any seq_length.
    """
    if seq_length < 3:
        raise ExportError(f"seq_length {seq_length} leaves no room for a wordpiece after [CLS] and [SEP]")
    _check_export_dir(export_dir, overwrite)
    metadata = {
        "format": "bert_tf SavedModel",
        "version": METADATA_VERSION,
        "export_type": "preprocessor",
        "max_seq_length": int(seq_length),
        "tokenizer": tokenizer_metadata(do_lower_case, strip_accents),
    }

    def save(tmp_dir, vocab_asset, metadata_file):
        tokenizer = InGraphTokenizer(vocab_asset, do_lower_case=do_lower_case, strip_accents=strip_accents)
        module = PreprocessorServing(tokenizer, seq_length, metadata_file)
        tf.saved_model.save(module, tmp_dir, signatures=module.signatures())

    return _save_export(export_dir, vocab_file, metadata, save)


def _save_export(export_dir: str, vocab_file: str, metadata: dict, save) -> str:
    """Writes the vocab and the metadata as assets, calls save(tmp_dir, vocab_asset, metadata_file)
    to write the SavedModel to a temporary sibling of export_dir, and renames that into place."""
    export_dir = export_dir.rstrip("/")
    parent = os.path.dirname(os.path.abspath(export_dir))
    tf.io.gfile.makedirs(parent)
    staging = tempfile.mkdtemp(prefix=".export-assets-")
    tmp_dir = f"{export_dir}.tmp-{os.getpid()}"
    try:
        vocab_asset = _write_vocab_asset(vocab_file, staging)
        metadata_file = os.path.join(staging, METADATA_FILE)
        with open(metadata_file, "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2, sort_keys=True, ensure_ascii=False)
        if tf.io.gfile.exists(tmp_dir):
            tf.io.gfile.rmtree(tmp_dir)
        save(tmp_dir, vocab_asset, metadata_file)
        if tf.io.gfile.exists(export_dir):
            tf.io.gfile.rmtree(export_dir)  # only reached when empty or overwrite was asked for
        tf.io.gfile.rename(tmp_dir, export_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if tf.io.gfile.exists(tmp_dir):
            tf.io.gfile.rmtree(tmp_dir)
    return export_dir


def _check_savedmodel_only(export_type: Optional[str], export_format: str) -> None:
    if export_type == PREPROCESSOR and export_format != "savedmodel":
        raise ExportError(f"a {PREPROCESSOR} is a TF-Hub SavedModel; the ONNX export tokenizes in Python beside "
                          "the model")


def export_model_dir(model_dir: str, export_dir: str, export_type: Optional[str] = None,
                     max_seq_length: Optional[int] = None, overwrite: bool = False,
                     quantize: Optional[str] = None, export_format: str = "savedmodel", **kwargs) -> str:
    """Exports a fine-tuned model_dir (bert_tf.model_dir); export_type "encoder" exports its encoder only,
    "preprocessor" its TF-Hub preprocessor (vocab and casing; no weights).

    A pretraining model_dir exports its encoder. max_seq_length defaults to the one trained with.
    quantize: None (float32) or "int8"; export_format: "savedmodel" or "onnx" (see export_serving_model).
    """
    check_format(export_format)
    _check_savedmodel_only(export_type, export_format)
    quantize = check_quantize(quantize, export_format)
    _check_remote(model_dir)  # (isdir would call an unreachable bucket "not found")
    try:
        config, info = model_dir_lib.read(model_dir)
        _check_export_dir(export_dir, overwrite)
        vocab_file = model_dir_lib.vocab_path(model_dir)
        if not tf.io.gfile.exists(vocab_file):
            raise ExportError(f"{vocab_file}: not found")
        if export_type == PREPROCESSOR:
            if quantize:
                raise ExportError("a preprocessor has no weights to quantize")
            return export_preprocessor(export_dir, vocab_file, info["do_lower_case"],
                                       max_seq_length or info["max_seq_length"],
                                       strip_accents=info.get("strip_accents"), overwrite=overwrite)
        model = model_dir_lib.restore(model_dir)
    except CheckpointError as e:
        raise ExportError(str(e)) from None
    task = info["task_type"]
    export_type = export_type or ("encoder" if task == "pretraining" else task)
    if export_type != "encoder" and export_type != task:
        raise ExportError(f"{model_dir}: a {task} model cannot be exported as {export_type}; use encoder, "
                          f"{PREPROCESSOR} or {task}")
    if "max_query_length" in info:
        kwargs.setdefault("max_query_length", info["max_query_length"])
    if export_type in ("classification", "regression") and info.get("long_inputs") == "windows":
        kwargs.setdefault("windows", (info["doc_stride"], info["window_aggregation"]))
    elif export_type == "tagging" and info.get("doc_stride"):
        kwargs.setdefault("windows", (info["doc_stride"], None))
    return _write_serving_model(
        model, export_type, export_dir, vocab_file, do_lower_case=info["do_lower_case"],
        max_seq_length=max_seq_length or info["max_seq_length"], strip_accents=info.get("strip_accents"),
        label_list=info.get("label_list") if task in ("classification", "tagging") else None,
        num_choices=info.get("num_choices"), overwrite=overwrite, quantize=quantize, export_format=export_format,
        **kwargs)


def export_checkpoint(init_checkpoint: str, bert_config_file: Optional[str], vocab_file: Optional[str],
                      do_lower_case: bool, export_dir: str, max_seq_length: int, overwrite: bool = False,
                      quantize: Optional[str] = None, export_type: str = "encoder",
                      export_format: str = "savedmodel", onnx_fusions: bool = True) -> str:
    """Exports the encoder of a pretrained checkpoint: original TF1, Hugging Face folder/safetensors, or ours;
    export_type "preprocessor": its TF-Hub preprocessor instead (vocab and casing; the weights are not read).

    bert_config_file (an original bert_config.json or a Hugging Face config.json) and vocab_file
    default to the files beside the checkpoint (`pretrained.resolve_pretrained`).
    quantize: None (float32) or "int8"; export_format: "savedmodel" or "onnx" (see export_serving_model).
    """
    if export_type not in ("encoder", PREPROCESSOR):
        raise ExportError(f"a checkpoint exports an encoder or a {PREPROCESSOR}, not {export_type}; "
                          "use a model_dir for task models")
    check_format(export_format)
    _check_savedmodel_only(export_type, export_format)
    quantize = check_quantize(quantize, export_format)
    if quantize and export_type == PREPROCESSOR:
        raise ExportError("a preprocessor has no weights to quantize")
    for path, what in ((bert_config_file, "bert_config_file"), (vocab_file, "vocab_file")):
        if path and not tf.io.gfile.exists(path):
            raise ExportError(f"{path}: {what} not found")
    _check_export_dir(export_dir, overwrite)
    try:
        pretrained = resolve_pretrained(init_checkpoint, bert_config_file, vocab_file)
        if export_type == PREPROCESSOR:
            return export_preprocessor(export_dir, pretrained.vocab_file, do_lower_case, max_seq_length,
                                       overwrite=overwrite)
        encoder = pretrained.build_encoder()
        load_pretrained(encoder, pretrained.init_checkpoint, pretrained.fmt)
    except (CheckpointError, ConfigError, InputDataError) as e:
        raise ExportError(str(e).splitlines()[0]) from None
    return _write_serving_model(encoder, "encoder", export_dir, pretrained.vocab_file, do_lower_case=do_lower_case,
                                max_seq_length=max_seq_length, overwrite=overwrite, quantize=quantize,
                                export_format=export_format, onnx_fusions=onnx_fusions)
