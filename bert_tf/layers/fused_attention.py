"""cuDNN's fused (flash) attention, reached from an XLA-compiled TensorFlow step (a GPU candidate).

TensorFlow has no op for cuDNN's fused attention and Keras 3's `dot_product_attention(
flash_attention=True)` refuses the TensorFlow backend, but XLA's GPU backend still runs the custom
calls JAX emits for it. `fused_attention` emits them with `xla.custom_call_v2`: the forward call
`__cudnn$fmhaSoftmax` (`__cudnn$fmhaSoftmaxDropout` with attention dropout) returns the context and
the softmax statistics, and `tf.custom_gradient` wires the backward call, which recomputes the
probabilities from those statistics instead of keeping the [B, N, F, T] matrix (the memory traffic
is the gain: at seq 128 attention is a few percent of BERT-base's FLOPs).

Two operand layouts (`layout`): "BNTH", q/k/v [B, N, F|T, D] (the heads transposed apart, as the
default attention's batched matmuls take them); "BTNH", q [B, F, N, D], k/v [B, T, N, D], the
projections' rows merely reshaped, so the three head transposes before the forward call and the
one of dO before the backward call go. What stays in BTNH: `xla.custom_call_v2` gives every
operand and result XLA's default (row-major) layout, and XLA describes the forward's O and
the backward's dQ, dK, dV to cuDNN by their plain shapes (cudnn_custom_call_compiler.cc), which must
be [B, N, *, D]: those come out BNTH and are transposed here (JAX gives them a BTNH memory layout
instead, which TensorFlow cannot ask for). The backward's O is described like dO
(cuda_dnn.cc GetCudnnFlashAttentionBackwardOperationGraph), so it goes in as BTNH, like dO.

BERT's padding mask is cuDNN's PADDING mask: per-row query and key lengths, the real tokens first
(as in every unpacked BERT batch). The custom calls have only a GPU implementation: they compile
inside a `jit_compile` step on a GPU, and on a CPU only lower to HLO (what the tests check).
JSON layout of the configuration: JAX's `jax/_src/cudnn/fused_attention_stablehlo.py`.

Why the outputs are masked: the cuDNN thunk of TensorFlow 2.20's XLA does not zero what the PADDING
mask leaves out (XLA gained that zero-fill later, openxla/xla PR #44867): the padded query rows of O
and dQ and the padded key rows of dK and dV keep whatever the buffer held, possibly NaN, and would
reach the next layer and the weight gradients. `zero_beyond` sets them to 0 with a select (tf.where),
not a multiply, since NaN x 0 is NaN.

Dimensions: B batch, N heads, F query positions, T key positions, D head size.
"""

from __future__ import annotations

import json

import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla

FORWARD_TARGETS = {False: "__cudnn$fmhaSoftmax", True: "__cudnn$fmhaSoftmaxDropout"}  # keyed by dropout
BACKWARD_TARGETS = {False: "__cudnn$fmhaSoftmaxBackward", True: "__cudnn$fmhaSoftmaxDropoutBackward"}
_DTYPE_NAMES = {tf.bfloat16: "BF16", tf.float16: "F16"}
# The head size cuDNN's flash kernels take (cuDNN 9: at most 128 on every card, a multiple of 8).
MAX_HEAD_SIZE = 128

# ((lhs contracting, rhs contracting), (lhs batch, rhs batch)) of the six products per operand layout, as
# JAX's create_dot_product_attention_backend_config (jax/_src/cudnn/fused_attention_stablehlo.py) numbers them:
# forward Q K^T -> P, P V -> O; backward dP^T Q -> dK, dP K -> dQ, P^T dO -> dV, dO V^T -> dP. P and dP are
# [B, N, F, T] in both layouts (batch dims (0, 1)); Q, K, V, O and dO are [B, N, *, D] in BNTH (batch (0, 1)),
# [B, *, N, D] in BTNH (batch (0, 2), the sequence axis 1).
FORWARD_DOTS = {
    "BNTH": {"bmm1_dot_dimension_numbers": ((3, 3), ((0, 1), (0, 1))),
             "bmm2_dot_dimension_numbers": ((3, 2), ((0, 1), (0, 1)))},
    "BTNH": {"bmm1_dot_dimension_numbers": ((3, 3), ((0, 2), (0, 2))),
             "bmm2_dot_dimension_numbers": ((3, 1), ((0, 1), (0, 2)))},
}
BACKWARD_DOTS = {
    "BNTH": {"bmm1_grad_gemm1_dot_dimension_numbers": ((2, 2), ((0, 1), (0, 1))),
             "bmm1_grad_gemm2_dot_dimension_numbers": ((3, 2), ((0, 1), (0, 1))),
             "bmm2_grad_gemm1_dot_dimension_numbers": ((2, 2), ((0, 1), (0, 1))),
             "bmm2_grad_gemm2_dot_dimension_numbers": ((3, 3), ((0, 1), (0, 1)))},
    "BTNH": {"bmm1_grad_gemm1_dot_dimension_numbers": ((2, 1), ((0, 1), (0, 2))),
             "bmm1_grad_gemm2_dot_dimension_numbers": ((3, 1), ((0, 1), (0, 2))),
             "bmm2_grad_gemm1_dot_dimension_numbers": ((2, 1), ((0, 1), (0, 2))),
             "bmm2_grad_gemm2_dot_dimension_numbers": ((3, 3), ((0, 2), (0, 2)))},
}
LAYOUTS = tuple(FORWARD_DOTS)
# The axis of the sequence (F or T) in q, k, v and the context, per layout.
SEQUENCE_AXIS = {"BNTH": 2, "BTNH": 1}


def backend_config(batch: int, heads: int, queries: int, keys: int, dtype, scale: float, dropout_rate: float,
                   seed: int, backward: bool, layout: str = "BNTH") -> str:
    """The custom call's JSON GpuBackendConfig: flash attention, PADDING mask, operands in `layout`."""
    dots = (BACKWARD_DOTS if backward else FORWARD_DOTS)[layout]
    config = {
        "algorithm": {"algo_id": "0", "math_type": "TENSOR_OP_MATH", "tuning_knobs": {"17": "1", "24": "0"},
                      "is_cudnn_frontend": True, "workspace_size": "0"},
        "fmha_scale": float(scale),
        "dropout_rate": float(dropout_rate),
        "seed": int(seed),
        "intermediate_tensor_shape": {
            "element_type": _DTYPE_NAMES[tf.as_dtype(dtype)],
            "dimensions": [str(d) for d in (batch, heads, queries, keys)],
            "tuple_shapes": [],
            "layout": {"minor_to_major": ["3", "2", "1", "0"], "tiles": [], "element_size_in_bits": "0",
                       "memory_space": "0", "index_primitive_type": "PRIMITIVE_TYPE_INVALID",
                       "pointer_primitive_type": "PRIMITIVE_TYPE_INVALID",
                       "dynamic_shape_metadata_prefix_bytes": "0"},
            "is_dynamic_dimension": [False] * 4,
        },
        "is_flash_attention": True,
        "mask_type": "PADDING",
        "sliding_window_length": 0,
    }
    for name, ((lhs, rhs), (lhs_batch, rhs_batch)) in dots.items():
        config[name] = {"lhs_contracting_dimensions": [str(lhs)], "rhs_contracting_dimensions": [str(rhs)],
                        "lhs_batch_dimensions": [str(d) for d in lhs_batch],
                        "rhs_batch_dimensions": [str(d) for d in rhs_batch]}
    return json.dumps({"operation_queue_id": "0", "wait_on_operation_queues": [], "cudnn_fmha_backend_config": config})


def check_supported(head_size: int, dtype) -> None:
    """One-line ValueError for a head size or dtype cuDNN's flash attention does not take."""
    if head_size > MAX_HEAD_SIZE or head_size % 8:
        raise ValueError(f"cudnn attention needs a head size of at most {MAX_HEAD_SIZE} and a multiple of 8, "
                         f"got {head_size}")
    if tf.as_dtype(dtype) not in _DTYPE_NAMES:
        raise ValueError(f"cudnn attention runs in bfloat16 or float16 (mixed precision), got {tf.as_dtype(dtype).name}")


def zero_beyond(x, lengths, axis: int = 2):
    """x with the positions l >= lengths[b] of `axis` (its sequence axis: 2 of [B, N, L, D], 1 of
    [B, L, N, D]) set to exactly 0 (a select: a NaN there becomes 0 too); lengths int [B]."""
    positions = tf.range(tf.shape(x)[axis], dtype=tf.int32)  # [L]
    to_axis = [1] * x.shape.rank
    to_axis[axis] = -1
    keep = tf.reshape(positions, to_axis) < tf.reshape(tf.cast(lengths, tf.int32), [-1] + [1] * (x.shape.rank - 1))
    return tf.where(keep, x, tf.zeros_like(x))


def fused_attention(q, k, v, query_lengths, key_lengths, scale: float, dropout_rate: float = 0.0, seed: int = 0,
                    layout: str = "BNTH"):
    """softmax(q k^T * scale, keys masked beyond each row's length) v, with dropout on the probabilities.

    layout "BNTH": q [B, N, F, D], k, v [B, N, T, D] -> context [B, N, F, D]; "BTNH": q [B, F, N, D],
    k, v [B, T, N, D] -> context [B, F, N, D]. bfloat16 or float16, static shapes; query_lengths,
    key_lengths: int [B], each row's real queries and keys (the first ones); dropout_rate with a fixed
    `seed` (an attribute of the call, not a tensor: cuDNN's own dropout mask). Padded queries get
    zeros, as do the gradients' padded rows (zero_beyond, after each call). Only inside a jit-compiled
    function (XLA), run on an NVIDIA GPU.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"cudnn attention layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    axis = SEQUENCE_AXIS[layout]
    batch, head_size = q.shape[0], q.shape[3]
    heads, queries, keys = q.shape[3 - axis], q.shape[axis], k.shape[axis]
    if None in (batch, heads, queries, head_size, keys):
        raise ValueError(f"cudnn attention needs static shapes (XLA), got q {q.shape} and k {k.shape}")
    check_supported(head_size, q.dtype)
    dropout = dropout_rate > 0
    lengths = [tf.cast(query_lengths, tf.int32), tf.cast(key_lengths, tf.int32)]  # [B] each
    configs = {backward: backend_config(batch, heads, queries, keys, q.dtype, scale, dropout_rate, seed, backward,
                                        layout) for backward in (False, True)}
    stats_spec = tf.TensorSpec([batch, heads, queries], tf.float32)  # the softmax statistics (log-sum-exp)
    workspace = tf.TensorSpec([0], tf.uint8)  # sized by XLA

    def heads_spec(length, dtype):  # O, dQ, dK, dV as the calls return them: [B, N, L, D] in both layouts
        return tf.TensorSpec([batch, heads, length, head_size], dtype)

    def in_layout(x):  # [B, N, L, D] -> the layout's own
        return x if layout == "BNTH" else tf.transpose(x, [0, 2, 1, 3])

    @tf.custom_gradient
    def attend(q, k, v):
        out, stats, _ = xla.custom_call_v2(
            FORWARD_TARGETS[dropout], [q, k, v, *lengths],
            [heads_spec(queries, q.dtype), stats_spec, workspace], backend_config=configs[False])
        out = zero_beyond(in_layout(out), lengths[0], axis)  # the backward reads the masked O: its padded rows are 0 too

        def grad(d_out):
            dq, dk, dv, _ = xla.custom_call_v2(
                BACKWARD_TARGETS[dropout], [q, k, v, stats, tf.cast(d_out, q.dtype), out, *lengths],
                [heads_spec(queries, q.dtype), heads_spec(keys, k.dtype), heads_spec(keys, v.dtype), workspace],
                backend_config=configs[True])
            return (zero_beyond(in_layout(dq), lengths[0], axis), zero_beyond(in_layout(dk), lengths[1], axis),
                    zero_beyond(in_layout(dv), lengths[1], axis))

        return out, grad

    return attend(q, k, v)
