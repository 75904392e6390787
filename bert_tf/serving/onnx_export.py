"""The ONNX half of an export: the model (token ids in, float outputs out) as model.onnx, for ONNX Runtime.

Why a second format: at batch 1 on CPUs TensorFlow's cost per op, not its kernels, sets the latency;
ONNX Runtime ran the same weights about 2x faster there (issue 46; benchmarks/RESULTS.md, Serving). bert_tf.export owns what a
model_dir exports (export types, options, vocab and metadata beside it, the temporary name renamed
into place); this module only turns the Keras model into ONNX:

  1. a tf.function over the served model (the task model, or its encoder) with the TF-Hub inputs
     int32 [B, S] (multiple choice [B, C, S]), both axes dynamic, returning named float32 outputs
     (EXPORT_OUTPUTS); the task model's dense layers on real tokens only, as in the SavedModel (its
     skip_padding gathers: 1.7-1.8x batch-32 texts/s on MiniLM, batch 1 unchanged, since a batch-1 request
     has no padding), and LayerNorm traced as the plain op chain that ONNX Runtime fuses into one
     LayerNormalization when it loads the model;
  2. tf2onnx converts it (opset OPSET);
  3. `quantize="int8"`: onnxruntime.quantization.quantize_dynamic, int8 weights per output channel,
     uint8 activations per call (the MatMuls but the first layer's attention projections, KEPT_FLOAT;
     embeddings, LayerNorm, softmax stay float32);
  4. `fusions` (the default): ONNX Runtime's own LayerNormalization and FastGelu / Gelu ops in place of
     the op chains tf2onnx writes (bert_tf.serving.onnx_fusions), which ONNX Runtime's
     fusers do not recognise; attention stays as tf2onnx writes it.

Tokenizing and the task's post-processing (answer spans, one tag per word) run in Python beside the
session (bert_tf.serving.onnx_predictor), with FullTokenizer's rules.

Dimensions: B batch, C choices, S sequence (any length up to max_position_embeddings), H hidden, L labels.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import unicodedata
from typing import Dict, List, Optional

import tensorflow as tf

from bert_tf.errors import ExportError
from bert_tf.layers.normalization import plain_ops_for_export
from bert_tf.serving.formats import ONNX_FILE, ONNX_FORMAT
from bert_tf.serving.module import HUB_INPUTS, our_names
from bert_tf.serving.onnx_fusions import fuse

logger = logging.getLogger(__name__)

OPSET = 17
INSTALL = 'pip install -e ".[onnx]"'
# What each export type's graph returns (all float32), after the three int32 inputs HUB_INPUTS.
EXPORT_OUTPUTS = {
    "classification": ("logits", "probabilities"),  # [B, L] each
    "regression": ("score",),  # [B]
    "span": ("start_logits", "end_logits"),  # [B, S] each
    "multiple_choice": ("logits", "probabilities"),  # [B, C] each
    "tagging": ("logits", "probabilities"),  # [B, S, L] each
    "encoder": ("pooled_output", "sequence_output"),  # [B, H], [B, S, H]; + encoder_outputs[_i] [B, S, H]
}


OnnxExportError = ExportError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


def check_installed() -> Dict[str, str]:
    """{package: version} of tf2onnx, onnx and onnxruntime; ExportError naming the install command."""
    versions = {}
    for name in ("tf2onnx", "onnx", "onnxruntime"):
        try:
            module = __import__(name)
        except ImportError:
            raise ExportError(f"the ONNX export needs {name} (with tf2onnx, onnx and onnxruntime): "
                                  f"{INSTALL}") from None
        versions[name] = getattr(module, "__version__", "unknown")
    return versions


def _named_outputs(export_type: str, out) -> Dict[str, tf.Tensor]:
    """The served model's outputs -> EXPORT_OUTPUTS[export_type] (float32)."""
    if export_type == "encoder":
        named = {"pooled_output": out["pooled_output"], "sequence_output": out["sequence_output"]}
        for i, layer in enumerate(out["encoder_outputs"]):
            named["encoder_outputs" if i == 0 else f"encoder_outputs_{i}"] = layer
        return {k: tf.cast(v, tf.float32) for k, v in named.items()}
    if export_type == "span":
        return {k: tf.cast(out[k], tf.float32) for k in EXPORT_OUTPUTS["span"]}
    logits = tf.cast(out, tf.float32)
    if export_type == "regression":
        return {"score": logits[:, 0]}
    return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}


def graph_function(served, export_type: str, ids_rank: int = 2):
    """(tf.function of the three TF-Hub int32 inputs -> the named outputs, its input signature)."""
    specs = [tf.TensorSpec([None] * ids_rank, tf.int32, name=name) for name in HUB_INPUTS]

    def forward(input_word_ids, input_mask, input_type_ids):
        hub = dict(zip(HUB_INPUTS, (input_word_ids, input_mask, input_type_ids), strict=True))
        # The served model's own skip_padding (bert_tf/models/encoder.py): a padded batch's dense layers run
        # on its real tokens only (40% of a batch-32 MiniLM call's rows are padding on the testament dev set).
        with plain_ops_for_export():
            return _named_outputs(export_type, served(our_names(hub), training=False))

    return tf.function(forward, input_signature=specs, autograph=False), specs


def _fuse(path: str, config) -> Dict[str, int]:
    """ONNX Runtime's fused LayerNorm and GELU ops in place of their chains
    (bert_tf.serving.onnx_fusions), in the file at `path`; returns {op: count}."""
    import onnx

    model = onnx.load(path)
    counts = fuse(model, config.hidden_size)
    onnx.save(model, path)
    return counts


# The MatMuls quantize="int8" keeps float32: the first layer's attention projections (query, key, value, output),
# which read the embeddings' LayerNorm. With them int8, MiniLM's int8 labels agreed with float32 on 98.5% of the
# testament dev set (HF -> ONNX Runtime int8: 98.8%); float32, 99.25% at ~1/18 of the encoder's matmul work
# (the whole first layer float32: 100%, at 3x that). Matched by our layers' names (TransformerBlock "layer_0").
KEPT_FLOAT = re.compile(r"/layer_0(_\d+)?/attention(_\d+)?/")


def _kept_float(path: str) -> List[str]:
    """The names of the KEPT_FLOAT MatMul nodes of the model at `path` (tf2onnx writes our dense layers as
    MatMul; tests/test_export_onnx.py counts what stays float)."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type == "MatMul" and KEPT_FLOAT.search(n.name)]


def quantization_method() -> dict:
    """How quantize="int8" quantizes (the export's metadata)."""
    return {"tool": "onnxruntime.quantization.quantize_dynamic", "weights": "int8, one scale per output channel",
            "activations": "uint8, range per call",
            "ops": "MatMul (and Gemm) but the first layer's attention projections; the rest float32"}


def metadata_entries(export_type: str, do_lower_case: bool, strip_accents: Optional[bool], quantize: Optional[str],
                     fusions: bool) -> dict:
    """The export metadata's ONNX entries: the file, its inputs and outputs, the tools, and the tokenizer."""
    versions = check_installed()
    entries = {
        "format": ONNX_FORMAT,
        "onnx": {"file": ONNX_FILE, "opset": OPSET, "inputs": list(HUB_INPUTS),
                 "outputs": list(EXPORT_OUTPUTS[export_type]) + (["encoder_outputs", "encoder_outputs_<i>"]
                                                                if export_type == "encoder" else []),
                 "fusions": bool(fusions), "versions": versions},
        "tokenizer": {
            "rules": "FullTokenizer (google-research/bert tokenization.py), in Python beside the ONNX Runtime "
                     "session (bert_tf.tokenization.FastTokenizer, the same ids)",
            "do_lower_case": bool(do_lower_case),
            "strip_accents": bool(do_lower_case if strip_accents is None else strip_accents),
            "max_chars_per_word": 200,
            "python_unicode_version": unicodedata.unidata_version,
        },
    }
    if quantize:
        entries.update(quantization="int8-dynamic", quantization_method=quantization_method())
    return entries


def write_export(served, export_type: str, export_dir: str, assets, config, ids_rank: int,
                 quantize: Optional[str], fusions: bool) -> None:
    """export_dir/model.onnx (write_onnx) and export_dir/assets/<each of `assets`> (local files)."""
    staging = tempfile.mkdtemp(prefix=".onnx-model-")
    try:
        write_onnx(served, export_type, staging, config, ids_rank, quantize, fusions)
        tf.io.gfile.makedirs(os.path.join(export_dir, "assets"))
        tf.io.gfile.copy(os.path.join(staging, ONNX_FILE), os.path.join(export_dir, ONNX_FILE), overwrite=True)
        for path in assets:
            tf.io.gfile.copy(path, os.path.join(export_dir, "assets", os.path.basename(path)), overwrite=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _quiet_tools():
    """tf2onnx and ONNX Runtime's optimizer and quantizer log every node at INFO (dozens of lines per export)."""
    loggers = [logging.getLogger(), logging.getLogger("tf2onnx")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


@contextlib.contextmanager
def _tf2onnx_without_weight_copies():
    """tf2onnx 1.17 kept about one copy of every weight per optimizer pass: BERT-base (440 MB of weights) reached
    16 GB RSS in its ONNX optimizers alone, and 23 GB in the benchmark's process, killed. Two causes, both undone
    for the conversion only:
      - each pass deep-copies the whole graph to restore it if the pass raises (TF2ONNX_CATCH_ERRORS=FALSE turns
        that off: a failing pass fails the export, with its one-line message);
      - Node.update_proto clears and refills the node's NodeProto attributes; with protobuf's upb backend the
        cleared ones (a Const's tensor) stay allocated in the proto's arena until it is freed. A fresh
        NodeProto per update lets the old one go.
    With both, converting BERT-base peaks at 10 GB (before the optimizers, in TensorFlow's freezing and grappler)."""
    import onnx
    from tf2onnx import constants
    from tf2onnx.graph import Node

    refill = Node.update_proto

    def update_proto(node, external_tensor_storage=None):
        old = node._op  # noqa: SLF001  (tf2onnx keeps the proto there)
        node._op = onnx.NodeProto(name=old.name, op_type=old.op_type, domain=old.domain, doc_string=old.doc_string)
        return refill(node, external_tensor_storage)

    saved = os.environ.get(constants.ENV_TF2ONNX_CATCH_ERRORS)
    os.environ[constants.ENV_TF2ONNX_CATCH_ERRORS] = "FALSE"
    Node.update_proto = update_proto
    try:
        yield
    finally:
        Node.update_proto = refill
        if saved is None:
            os.environ.pop(constants.ENV_TF2ONNX_CATCH_ERRORS, None)
        else:
            os.environ[constants.ENV_TF2ONNX_CATCH_ERRORS] = saved


def write_onnx(served, export_type: str, folder: str, config, ids_rank: int = 2, quantize: Optional[str] = None,
               fusions: bool = False) -> str:
    """Converts `served` (a task model or an encoder) to folder/model.onnx; returns its path.

    quantize: None or "int8"; fusions: ONNX Runtime's fused LayerNorm and GELU ops, after quantizing.
    """
    import tf2onnx

    function, specs = graph_function(served, export_type, ids_rank)
    path = os.path.join(folder, ONNX_FILE)
    work = tempfile.mkdtemp(prefix=".onnx-export-")
    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet_tools())
        stack.enter_context(_tf2onnx_without_weight_copies())
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        current = os.path.join(work, "converted.onnx")
        try:
            tf2onnx.convert.from_function(function, input_signature=specs, opset=OPSET, output_path=current)
        except Exception as e:  # tf2onnx raises many types; the first line says which op
            raise ExportError(f"tf2onnx could not convert the {export_type} model: "
                                  f"{str(e).splitlines()[0][:300]}") from None
        if quantize == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(current, os.path.join(work, "int8.onnx"), per_channel=True, weight_type=QuantType.QInt8,
                             nodes_to_exclude=_kept_float(current))
            current = os.path.join(work, "int8.onnx")
        fused = _fuse(current, config) if fusions else {}  # after quantizing: its shape inference does not
        shutil.move(current, path)                           # know ONNX Runtime's own ops
    if fusions:
        logger.info("ONNX Runtime's fused ops: %s", ", ".join(f"{n} {op}" for op, n in sorted(fused.items())) or "none")
    return path
