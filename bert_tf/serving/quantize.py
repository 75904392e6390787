"""Dynamic int8 Transformer blocks for the serving export (`export_serving_model(..., quantize="int8")`).

What runs in int8: the six dense layers of every Transformer block (attention
query, key, value and output, intermediate, output). Embeddings, LayerNorm,
softmax, the attention matmuls, the pooler and the task heads stay float32.

How (dimensions: M = B * S rows, K inputs, N outputs):
  weights      W [K, N] -> int8 Wq = round(W * 64 / max|W[:, n]|) in [-64, 64] (129
               levels, "7-bit"; why not 127: below), symmetric, one scale per output
               column (per tensor on request: 5x the error on real BERT weights, no
               faster); embedded in the serving graph as constants.
  activations  per call, from the runtime min and max of x [M, K] (one range per
               tensor): uint8 xq = round((x - min) * 255 / (max - min)) (QuantizeV2,
               MIN_COMBINED). The range is the whole batch's, so a text's result
               moves slightly with the other texts it is batched with (as in
               PyTorch's dynamic quantization); the kernel takes one input scale.
               Except in the two output projections (attention output, FFN output;
               TOKEN_RANGE_PATHS): there each token (row) gets its own range, and the
               row's scale and offset are applied after the kernel (Int8DenseTokenRanges).
               Their inputs (attention context; GELU outputs, K = 4H) carry the
               outlier tokens that stretch one tensor-wide range; on a fine-tuned MiniLM
               classifier (400 dev sentences) per-token ranges there take label agreement
               with float32 from 99.0% / 98.5% (own ISA / AVX2) to 99.2% / 99.5% and
               halve max |dp|; per-token everywhere reached 99.8% but cost 40% of
               batch-32 throughput (figures in benchmarks/RESULTS.md).
  matmul       TensorFlow's oneDNN int8 kernel `_QuantizedMatMul` (fused BiasAdd,
               activation, Dequantize; SCALED input mode):
               y = act((max - min) / 255 * max|W[:, n]| / 64 * (xq @ Wq)[:, n] + bias'[n]),
               float32 out, where bias' = b + min * scale_w * colsum(Wq) puts back
               the offset (x = min + (max - min) / 255 * xq); the block's GELU (or
               relu/tanh) runs inside the kernel.
Why the weights use [-64, 64] (one artifact, right on every x86 CPU): oneDNN's u8 x s8
kernels for CPUs without VNNI (AVX2 such as AMD Zen 3, AVX-512 without VNNI) multiply
adjacent pairs along K with vpmaddubsw, which adds the two products into a signed
16-bit lane with saturation: 255 * 127 * 2 = 64770 overflows 32767, and a layer with
large activations and weights came out 12% wrong (relative to its output range)
while the same SavedModel was right on a VNNI machine, whose kernels accumulate in 32
bits. With |Wq| <= 64 a pair is at most 255 * 64 * 2 = 32640, so nothing saturates
and every ISA computes the same integers. Keeping 8-bit activations and giving the
bit up on the weights is the better half to lose: the weights have one scale per
column, the activations one range per tensor (on the unit test's layer, relative
error 1.1% against 1.4% for 7-bit activations and 0.8% with no bit given up; the
real-weight figures are in the README). The tests run under the machine's own ISA
and again with ONEDNN_MAX_CPU_ISA=AVX2, which makes a newer CPU take the older
CPUs' kernels. PyTorch's x86 dynamic quantization gives the bit up on the
activations instead (`reduce_range`), because its kernels take no per-tensor offset
in the bias as ours do.

Measured choices (tests/test_export_int8.py checks the arithmetic against a float
matmul): the older QuantizedMatMulWithBiasAndDequantize supports one weight scale
only, and its MIN_FIRST mode compensates the bias in the wrong units under oneDNN
v3 (relative error ~1e5 on inputs with negative values); `_QuantizedMatMul` takes
per-column weight scales, fuses the activation, and caches the reordered weights
when they are constants (`is_weight_const`), which is why they are embedded.

Column groups (latency at batch 1): the attention output, intermediate and FFN output layers
(SPLIT_PATHS) compute their output columns as COLUMN_GROUPS = 2 independent matmuls whose results
are concatenated. Every column is the same arithmetic as in one matmul (same int8 input, same
integers, same per-column scale), so the outputs do not change (max |dp| 0.0 on 100 MiniLM dev
sentences); what changes is that TensorFlow's inter-op pool (by default one thread per core, as
under TF Serving) runs the two halves at the same time: at batch 1 a small-M matmul is too small
for oneDNN to spread over the cores by itself. Measured on a fine-tuned MiniLM classifier (seq 64,
200 dev sentences, 2 intra-op threads, default inter-op threads, AMD EPYC Zen 3, AVX2): batch-1 p50
8.88 -> 7.68 ms and 9.49 -> 8.29 ms (two runs); batch 32 within noise (256 vs 251 texts/s); with
one inter-op thread no change. Four groups (8.45 ms) and splitting query/key/value too (7.86 ms)
were slower; query, key and value are already three independent matmuls.

The swap happens at export time from outside the model: `int8_dense_calls(encoder)`
replaces the `call` of those Dense sublayers while the serving functions are
traced and restores them after, so the model's own code path (attention,
residuals, LayerNorm) is what gets exported.

`_QuantizedMatMul` exists in x86 TensorFlow builds with oneDNN (the pip wheels);
it runs whether or not TF_ENABLE_ONEDNN_OPTS is set. `check_int8_runtime` says in
one line when the runtime lacks it.
"""

from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from bert_tf.errors import ExportError

QUANTIZE_MODES = ("int8",)
WEIGHT_SCALES = ("channel", "tensor")
# Dense sublayers of a TransformerBlock, as attribute paths.
BLOCK_DENSE_PATHS = ("attention.query", "attention.key", "attention.value", "attention.output_dense",
                     "intermediate", "output_dense")
INT8_OP = "_QuantizedMatMul"
# The Dense layers whose activations are quantized with one range per token (module doc).
TOKEN_RANGE_PATHS = ("attention.output_dense", "output_dense")
# The Dense layers computed as COLUMN_GROUPS independent matmuls over column ranges (module doc).
SPLIT_PATHS = ("attention.output_dense", "intermediate", "output_dense")
COLUMN_GROUPS = 2
# |Wq| <= WEIGHT_LEVELS: with uint8 activations a pair of products along K stays within a signed
# 16-bit lane (255 * 64 * 2 = 32640 <= 32767), so the non-VNNI kernels never saturate (module doc).
WEIGHT_LEVELS = 64
# What the exported graph's arithmetic is right on, for the metadata.
ISA_NOTE = ("exact int32 accumulation on every x86 oneDNN ISA (AVX2, AVX-512, AVX-512 VNNI, AMX): weights in "
            f"[-{WEIGHT_LEVELS}, {WEIGHT_LEVELS}] keep the non-VNNI kernels' pairwise 16-bit sums of uint8 x int8 "
            "products from saturating")
METHOD = {
    "quantization": "int8-dynamic",
    "layers": "the 6 dense layers of every Transformer block (attention query/key/value/output, intermediate, "
              "output); embeddings, LayerNorm, softmax, attention matmuls, pooler and heads float32",
    "activations": "uint8 per call from the runtime min/max of each layer's input, asymmetric: one range per "
                   "token in the attention-output and FFN-output layers, one per tensor in the others (so an "
                   "input's result varies slightly with the other inputs of its batch)",
    "weights": f"int8 symmetric in [-{WEIGHT_LEVELS}, {WEIGHT_LEVELS}], graph constants",
    "kernel": "TensorFlow's oneDNN _QuantizedMatMul (SCALED input, BiasAdd + activation + Dequantize fused, the "
              "uint8 offset compensated in the bias); x86 TensorFlow with oneDNN (pip wheels)",
}


QuantizationError = ExportError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


RUNTIME_ERROR = (f"int8 export needs TensorFlow's oneDNN int8 matmul ({INT8_OP}), which this runtime does not "
                 "run ({why}); use an x86 TensorFlow build with oneDNN (the pip wheels) or export float32")
# Activations the kernel fuses, by oneDNN name, and their float32 definitions (to recognise a layer's).
FUSED_ACTIVATIONS = {
    "GeluApproximate": lambda x: tf.nn.gelu(x, approximate=True),
    "GeluExact": lambda x: tf.nn.gelu(x, approximate=False),
    "Relu": tf.nn.relu,
    "Tanh": tf.tanh,
}


def int8_matmul(xq, wq, bias, x_range, w_max, activation: Optional[str] = None):
    """uint8 [M, K] x int8 [K, N] -> float32 [M, N] = act(x_range / 255 * w_max / 127 * (xq @ wq) + bias).

    (The kernel's own convention: w_max is the float value of an int8 127. Callers whose weights use
    fewer levels pass w_max scaled accordingly.)

    w_max: float32 [N] (per column) or [] (per tensor); activation: a FUSED_ACTIVATIONS name or None.
    Graph mode only (inside a tf.function).
    """
    from tensorflow.python.framework import op_def_library

    fused = ["BiasAdd"] + ([activation] if activation else []) + ["Dequantize"]
    _, _, op, _ = op_def_library._apply_op_helper(
        INT8_OP, name="Int8MatMul", device_inputs=[xq, wq, bias],
        host_inputs=[tf.zeros([], tf.float32), x_range, -w_max, w_max],
        Tdevice_outputs=[tf.float32], Thost_outputs=[], T1=tf.quint8, T2=tf.qint8, Tbias=tf.float32,
        Tout=tf.float32, U=tf.float32, transpose_a=False, transpose_b=False, fused_ops=fused,
        input_quant_mode="SCALED", output_quant_mode="SCALED", leakyrelu_alpha=0.2,
        is_weight_const=True,  # callers pass graph constants: oneDNN reorders them once and caches
        is_bias_const=False)  # the compensated bias changes with every input's range
    return op.outputs[0]


_RUNTIME_OK = set()  # kernel names that passed check_int8_runtime in this process


def check_int8_runtime() -> None:
    """Raises ExportError unless the int8 matmul runs here and gives the right answer."""
    if INT8_OP in _RUNTIME_OK:
        return

    @tf.function(autograph=False)
    def probe():
        # Row 2 x column 2 is the largest pair sum the export makes (255 * 64 * 2): exact only if
        # this runtime's kernel does not saturate it.
        xq = tf.bitcast(tf.constant([[1, 2], [255, 255]], tf.uint8), tf.quint8)
        wq = tf.bitcast(tf.constant([[3, WEIGHT_LEVELS], [-1, WEIGHT_LEVELS]], tf.int8), tf.qint8)
        return int8_matmul(xq, wq, tf.constant([0.5, 0.0]), tf.constant(255.0), tf.constant([127.0, 254.0]))

    try:
        value = probe().numpy()
    except (tf.errors.OpError, RuntimeError, TypeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise ExportError(RUNTIME_ERROR.format(why=first)) from None
    expected = np.array([[1.5, 2 * 3 * WEIGHT_LEVELS], [0.5 + 2 * 255, 2 * 255 * 2 * WEIGHT_LEVELS]], np.float32)
    if value.shape != (2, 2) or not np.allclose(value, expected, rtol=1e-5):
        raise ExportError(RUNTIME_ERROR.format(why=f"it computes {value.tolist()}, not {expected.tolist()}"))
    _RUNTIME_OK.add(INT8_OP)


# ---------------------------------------------------------------------------- weights
def quantize_kernel(kernel: np.ndarray, weight_scale: str = "channel") -> Tuple[np.ndarray, np.ndarray]:
    """float [K, N] -> (int8 [K, N] in [-WEIGHT_LEVELS, WEIGHT_LEVELS], float32 max|W|: [N] per column or []
    per tensor); W ~ Wq * max / WEIGHT_LEVELS."""
    if weight_scale not in WEIGHT_SCALES:
        raise ExportError(f"weight_scale {weight_scale!r}; expected one of {', '.join(WEIGHT_SCALES)}")
    w = np.asarray(kernel, np.float32)
    max_abs = np.abs(w).max(axis=0) if weight_scale == "channel" else np.abs(w).max()
    max_abs = np.maximum(max_abs, np.float32(1e-12)).astype(np.float32)  # an all-zero column stays zero
    q = np.clip(np.rint(w * (WEIGHT_LEVELS / max_abs)), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    return q, max_abs


def fused_activation_name(activation) -> Optional[str]:
    """The FUSED_ACTIVATIONS name that computes `activation` (to 1e-5 on a test range), "" for the identity,
    None when the kernel has no such activation (it then runs in float32 after the matmul)."""
    if activation is None:
        return ""
    x = tf.constant(np.linspace(-8.0, 8.0, 401, dtype=np.float32))
    try:
        y = np.asarray(activation(x), np.float32)
    except Exception:  # noqa: BLE001 - an activation that cannot run on a plain tensor is just not fused
        return None
    if np.allclose(y, x.numpy(), atol=1e-6):
        return ""
    for name, fn in FUSED_ACTIVATIONS.items():
        if np.allclose(y, fn(x).numpy(), atol=1e-5):
            return name
    return None


class Int8Dense:
    """The call of one keras Dense layer [..., K] -> [..., N] with int8 weights (see the module doc)."""

    def __init__(self, layer, weight_scale: str = "channel", column_groups: int = 1):
        kernel = layer.kernel.numpy()
        if kernel.ndim != 2:
            raise ExportError(f"{layer.name}: kernel of rank {kernel.ndim}; int8 needs a 2-D Dense kernel")
        self.units = kernel.shape[1]
        self.kernel_q, self.w_max = quantize_kernel(kernel, weight_scale)
        self.bias = layer.bias.numpy().astype(np.float32) if layer.use_bias else np.zeros(self.units, np.float32)
        # min * colsum: what x = min + step * xq adds to each output column, per unit of min.
        self.colsum = (self.kernel_q.astype(np.float64).sum(axis=0) * self.w_max / WEIGHT_LEVELS).astype(np.float32)
        # The kernel reads w_max as the float value of an int8 127 (int8_matmul).
        self.kernel_scale = (self.w_max * (127.0 / WEIGHT_LEVELS)).astype(np.float32)
        self.fused = fused_activation_name(layer.activation)
        self.activation = None if self.fused is not None else layer.activation
        self.compute_dtype = layer.compute_dtype
        # [start, end) of each group of output columns, computed as one matmul each (module doc).
        self.column_ranges = [(int(cols[0]), int(cols[-1]) + 1)
                              for cols in np.array_split(np.arange(self.units), column_groups) if len(cols)]

    def _matmul(self, xq, x_range, lo=None, activation: Optional[str] = None):
        """int8_matmul of xq [M, K] by each column group, concatenated: float32 [M, N]. With `lo` (the
        input's minimum) the bias is this layer's, offset-compensated; without it, zero."""
        parts = []
        for a, b in self.column_ranges:
            bias = (tf.constant(self.bias[a:b]) + lo * tf.constant(self.colsum[a:b]) if lo is not None
                    else tf.zeros([b - a]))
            scale = self.kernel_scale if self.kernel_scale.ndim == 0 else self.kernel_scale[a:b]  # per tensor: []
            parts.append(int8_matmul(xq, tf.constant(self.kernel_q[:, a:b], tf.qint8), bias, x_range,
                                     tf.constant(scale), activation=activation))
        return parts[0] if len(parts) == 1 else tf.concat(parts, axis=1)

    def __call__(self, inputs, training=None):
        del training  # no dropout inside a Dense layer
        if tf.executing_eagerly():  # the kernel is graph-only; eager calls (tests, notebooks) trace each time
            return tf.function(self._call, autograph=False)(inputs)
        return self._call(inputs)

    def _rows(self, inputs):
        """inputs [..., K] -> (float32 rows [M, K], a function putting outputs [M, N] back in the inputs'
        shape). The encoder's blocks pass token rows (rank 2): then the flatten and restore (7 shape ops)
        are left out. On the exported MiniLM classifier: 1358 -> 1106 non-constant ops in its graph,
        batch-1 p50 -3.5% (AMD Zen 3, 2 cores)."""
        x = tf.cast(inputs, tf.float32)
        if x.shape.rank == 2:
            return x, lambda y: y
        shape = tf.shape(x)
        return tf.reshape(x, [-1, shape[-1]]), lambda y: tf.reshape(y, tf.concat([shape[:-1], [self.units]], 0))

    def _call(self, inputs):
        x2, back = self._rows(inputs)  # [M, K]
        xq, lo, hi = tf.raw_ops.QuantizeV2(input=x2, min_range=tf.reduce_min(x2), max_range=tf.reduce_max(x2),
                                           T=tf.quint8, mode="MIN_COMBINED")
        # Constants made here live in the traced serving graph (oneDNN caches constant weights).
        y = back(self._matmul(xq, hi - lo, lo=lo, activation=self.fused or None))
        if self.activation is not None:
            y = self.activation(y)
        return tf.cast(y, self.compute_dtype)


class Int8DenseTokenRanges(Int8Dense):
    """Int8Dense with one activation range per row of x [M, K] (per token): the kernel computes the
    integer products at one unit scale, and each row's scale and offset are applied to its outputs."""

    def _call(self, inputs):
        x2, back = self._rows(inputs)  # [M, K]
        lo = tf.reduce_min(x2, axis=1, keepdims=True)  # [M, 1]
        span = tf.maximum(tf.reduce_max(x2, axis=1, keepdims=True) - lo, 1e-20)  # a constant row: xq = 0
        inv_step = 255.0 / span  # [M, 1]
        # round((x - lo) / step) for x >= lo; the cast truncates, so + 0.5 rounds (min: float slack at 255).
        xq = tf.bitcast(tf.cast(tf.minimum((x2 - lo) * inv_step + 0.5, 255.0), tf.uint8), tf.quint8)
        units = self._matmul(xq, tf.constant(255.0))  # [M, N]: (xq @ Wq) * max|W| / WEIGHT_LEVELS
        y = back(units * (span / 255.0) + (lo * tf.constant(self.colsum) + tf.constant(self.bias)))  # [M, N]
        if self.fused:
            y = FUSED_ACTIVATIONS[self.fused](y)
        elif self.activation is not None:
            y = self.activation(y)
        return tf.cast(y, self.compute_dtype)


# ---------------------------------------------------------------------------- the swap
def _attribute(obj, path):
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj


def block_dense_layers(encoder) -> List[Tuple[str, object]]:
    """[(name, Dense layer)] of the Transformer blocks, e.g. ("layer_0/attention/query", layer)."""
    import keras

    blocks = getattr(encoder, "blocks", None)
    if not blocks:
        raise ExportError(f"{type(encoder).__name__} has no Transformer blocks to quantize")
    found = []
    for i, block in enumerate(blocks):
        for path in BLOCK_DENSE_PATHS:
            layer = _attribute(block, path)
            if not isinstance(layer, keras.layers.Dense):
                raise ExportError(f"block {i} has no Dense layer {path}; int8 export knows the layout "
                                        f"{', '.join(BLOCK_DENSE_PATHS)}")
            if layer.dtype_policy.quantization_mode is not None:
                raise ExportError(f"block {i} {path} is already Keras-quantized "
                                        f"({layer.dtype_policy.quantization_mode})")
            found.append((f"{block.name}/{path.replace('.', '/')}", layer))
    return found


@contextlib.contextmanager
def int8_dense_calls(encoder, weight_scale: str = "channel", column_groups: int = COLUMN_GROUPS):
    """Within the block, the blocks' Dense layers of `encoder` compute in int8 (for tracing the export),
    those of SPLIT_PATHS in `column_groups` matmuls.

    Yields {"layers": [names], "replaced_variables": set of id(variable)} (the float kernels
    and biases no longer read); the layers' own `call` is back afterwards, even on error.
    """
    layers = block_dense_layers(encoder)
    token_ranges = {path.replace(".", "/") for path in TOKEN_RANGE_PATHS}
    split = {path.replace(".", "/") for path in SPLIT_PATHS}
    calls = []
    for name, layer in layers:
        path = name.split("/", 1)[1]
        int8_class = Int8DenseTokenRanges if path in token_ranges else Int8Dense
        calls.append((layer, int8_class(layer, weight_scale, column_groups if path in split else 1)))
    replaced = set()
    for layer, _ in calls:
        replaced.update(id(v) for v in layer.variables)
    patched = []
    try:
        for layer, int8 in calls:
            layer.call = int8  # the instance attribute shadows Dense.call; Keras looks it up per call
            patched.append(layer)
        yield {"layers": [name for name, _ in layers], "replaced_variables": replaced}
    finally:
        for layer in patched:
            del layer.call


def describe(weight_scale: str, layers: List[str], extra: Optional[Dict] = None) -> Dict:
    """The metadata entries of an int8 export."""
    method = dict(METHOD)
    method["weights"] += f", round(W * {WEIGHT_LEVELS} / max|W|), one max per " + (
        "output column" if weight_scale == "channel" else "tensor")
    method["weight_scale"] = weight_scale
    method["weight_levels"] = WEIGHT_LEVELS
    method["token_range_layers"] = [path.replace(".", "/") for path in TOKEN_RANGE_PATHS]
    method["column_groups"] = {"layers": [path.replace(".", "/") for path in SPLIT_PATHS], "groups": COLUMN_GROUPS}
    method["isa"] = ISA_NOTE
    method["quantized_layers"] = len(layers)
    method.update(extra or {})
    return method
