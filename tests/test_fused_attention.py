"""cuDNN fused attention (attention_implementation="cudnn"): on a CPU, what the compiled step's HLO holds.

The custom calls run only on an NVIDIA GPU (benchmarks/check_fused_attention.py compares them with
the default there); here the lowered HLO must hold them with the right shapes and configuration, and
the default implementation none.
"""

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_tf.configs import BertConfig
from bert_tf.layers import fused_attention
from bert_tf.layers.attention import SelfAttention
from bert_tf.models.encoder import BertEncoder
from bert_tf.models.pretrainer import BertPretrainer
from bert_tf.training.step import dtype_policy

B, S, H, N = 2, 8, 32, 2  # head size 16


def custom_calls(hlo):
    """[(target, result shape text, operand text, backend config dict)] of the HLO's custom calls."""
    out = []
    for line in hlo.splitlines():
        match = re.search(r'= (.*?) custom-call\((.*?)\), custom_call_target="([^"]+)"', line)
        if match:
            config = re.search(r"backend_config=(\{.*\})\s*$", line) or re.search(r"backend_config=\"(.*)\"", line)
            text = config.group(1).replace('\\"', '"') if config else "{}"
            shapes = [re.sub(r"\{[\d,]*\}| ", "", match.group(i)) for i in (1, 2)]  # without layouts
            out.append((match.group(3), *shapes, json.loads(text)))
    return out


def attention_hlo(implementation, precision="bfloat16", rate=0.1, mask=None):
    keras.utils.set_random_seed(1)
    with dtype_policy(precision):
        layer = SelfAttention(H, N, rate, 0.02, attention_implementation=implementation)
        layer.build()
    x = tf.random.normal((B, S, H))
    mask = tf.constant([[1] * S, [1] * 5 + [0] * 3], tf.int32) if mask is None else mask

    @tf.function(jit_compile=True, autograph=False)
    def step(x, mask):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.cast(layer(x, mask, training=True), tf.float32) ** 2)
        return tape.gradient(loss, [x] + layer.trainable_variables)

    return step.experimental_get_compiler_ir(x, mask)(stage="hlo")


# The dimension numbers JAX's create_dot_product_attention_backend_config writes for each layout
# (jax/_src/cudnn/fused_attention_stablehlo.py): {field: (lhs contracting, rhs contracting, lhs batch, rhs batch)}.
JAX_DOTS = {
    "BNTH": {"bmm1": (3, 3, [0, 1], [0, 1]), "bmm2": (3, 2, [0, 1], [0, 1]),
             "bmm1_grad_gemm1": (2, 2, [0, 1], [0, 1]), "bmm1_grad_gemm2": (3, 2, [0, 1], [0, 1]),
             "bmm2_grad_gemm1": (2, 2, [0, 1], [0, 1]), "bmm2_grad_gemm2": (3, 3, [0, 1], [0, 1])},
    "BTNH": {"bmm1": (3, 3, [0, 2], [0, 2]), "bmm2": (3, 1, [0, 1], [0, 2]),
             "bmm1_grad_gemm1": (2, 1, [0, 1], [0, 2]), "bmm1_grad_gemm2": (3, 1, [0, 1], [0, 2]),
             "bmm2_grad_gemm1": (2, 1, [0, 1], [0, 2]), "bmm2_grad_gemm2": (3, 3, [0, 2], [0, 2])},
}
IMPLEMENTATIONS = {"BNTH": "cudnn", "BTNH": "cudnn_btnh"}


def dot_numbers(config):
    return {k[: -len("_dot_dimension_numbers")]: (int(v["lhs_contracting_dimensions"][0]),
                                                   int(v["rhs_contracting_dimensions"][0]),
                                                   [int(d) for d in v["lhs_batch_dimensions"]],
                                                   [int(d) for d in v["rhs_batch_dimensions"]])
            for k, v in config.items() if k.endswith("_dot_dimension_numbers")}


@pytest.mark.parametrize("layout", ["BNTH", "BTNH"])
def test_cudnn_training_step_holds_forward_and_backward_calls_with_shapes_and_config(layout):
    calls = custom_calls(attention_hlo(IMPLEMENTATIONS[layout]))
    assert [c[0] for c in calls] == ["__cudnn$fmhaSoftmaxDropout", "__cudnn$fmhaSoftmaxDropoutBackward"]
    (_, fwd_out, fwd_in, fwd), (_, bwd_out, bwd_in, bwd) = calls
    heads = f"bf16[{B},{N},{S},16]"  # what the calls return in both layouts (O, dQ, dK, dV)
    operands = heads if layout == "BNTH" else f"bf16[{B},{S},{N},16]"  # Q, K, V (and O, dO going back)
    # forward: (Q, K, V, q lengths, kv lengths) -> (O, softmax statistics, workspace)
    assert fwd_out.startswith(f"({heads},f32[{B},{N},{S}],u8[0])")
    assert fwd_in.count(operands) == 3 and fwd_in.count(f"s32[{B}]") == 2
    # backward: (Q, K, V, statistics, dO, O, lengths) -> (dQ, dK, dV, workspace)
    assert bwd_out.startswith(f"({heads},{heads},{heads},u8[0])")
    assert bwd_in.count(operands) == 5 and f"f32[{B},{N},{S}]" in bwd_in and bwd_in.count(f"s32[{B}]") == 2
    if layout == "BTNH":
        assert heads not in fwd_in and heads not in bwd_in
    dots = JAX_DOTS[layout]
    for config, names in ((fwd, ["bmm1", "bmm2"]), (bwd, [n for n in dots if "grad" in n])):
        c = config["cudnn_fmha_backend_config"]
        assert c["is_flash_attention"] and c["mask_type"] == "PADDING"
        assert c["fmha_scale"] == pytest.approx(0.25) and c["dropout_rate"] == pytest.approx(0.1)
        assert c["intermediate_tensor_shape"]["dimensions"] == [str(d) for d in (B, N, S, S)]
        assert c["intermediate_tensor_shape"]["element_type"] == "BF16"
        assert dot_numbers(c) == {n: dots[n] for n in names}
    assert fwd["cudnn_fmha_backend_config"]["seed"] == bwd["cudnn_fmha_backend_config"]["seed"]


def test_btnh_leaves_out_the_head_transposes_of_q_k_v_and_d_out():
    """BNTH: q, k, v transposed to heads and the context back (forward), dO to heads and dQ, dK, dV back
    (backward): 8 head transposes. BTNH: only the calls' [B, N, *, D] results (O, dQ, dK, dV) are transposed,
    each straight from the call (cuDNN describes them by their plain shapes); its operands are reshapes."""
    def head_transposes(hlo):
        return re.findall(r"%(\S+) = \S+ transpose\(\S+ %(\S+)\), dimensions=\{0,2,1,3\}", hlo)

    assert len(head_transposes(attention_hlo("cudnn"))) == 8
    hlo = attention_hlo("cudnn_btnh")
    transposes = dict(head_transposes(hlo))
    assert len(transposes) == 4
    elements = dict(re.findall(r"%(\S+) = .* get-tuple-element\(.* %(custom-call\S*|XlaCustomCallV2\S*)\), index=", hlo))
    assert all(source in elements for source in transposes.values())  # each transposes a call's result
    for operands in re.findall(r"custom-call\((.*?)\), custom_call_target", hlo):
        names = re.findall(r"%(\S+?)(?:,|$)", operands)
        assert not set(names) & set(transposes) and not any(n.startswith("transpose") for n in names)


def test_backend_config_dimension_numbers_are_jaxs_for_both_layouts():
    for layout in ("BNTH", "BTNH"):
        for backward in (False, True):
            config = json.loads(fused_attention.backend_config(B, N, 4, S, tf.bfloat16, 0.25, 0.0, 3, backward, layout))
            c = config["cudnn_fmha_backend_config"]
            assert dot_numbers(c) == {n: d for n, d in JAX_DOTS[layout].items() if ("grad" in n) == backward}
            assert c["intermediate_tensor_shape"]["dimensions"] == [str(d) for d in (B, N, 4, S)]
    with pytest.raises(ValueError, match="layout must be one of BNTH, BTNH"):
        fused_attention.fused_attention(*[tf.zeros((B, S, N, 16), tf.bfloat16)] * 3, tf.ones(B), tf.ones(B), 0.25,
                                        layout="BSHN")


def test_cudnn_without_dropout_and_in_float16_uses_the_plain_softmax_call():
    calls = custom_calls(attention_hlo("cudnn", precision="float16", rate=0.0))
    assert [c[0] for c in calls] == ["__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"]
    assert calls[0][3]["cudnn_fmha_backend_config"]["intermediate_tensor_shape"]["element_type"] == "F16"


@pytest.mark.half_precision  # runs bfloat16 matmuls (conftest: they crash under an AVX2 cap on AMX CPUs)
def test_default_attention_has_no_custom_call_and_cudnn_inference_is_the_default_function():
    assert custom_calls(attention_hlo("xla")) == []
    x = tf.random.normal((B, S, H))
    mask = tf.constant([[1] * S, [1] * 5 + [0] * 3], tf.int32)
    outputs = []
    for implementation in ("xla", "cudnn", "cudnn_btnh"):
        keras.utils.set_random_seed(3)
        with dtype_policy("bfloat16"):
            layer = SelfAttention(H, N, 0.1, 0.02, attention_implementation=implementation)
            layer.build()
        outputs.append(layer(x, mask, training=False).numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])


def test_cudnn_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="attention_implementation must be one of xla, cudnn, cudnn_btnh"):
        SelfAttention(H, N, 0.1, 0.02, attention_implementation="flash")
    with pytest.raises(ValueError, match="causal"):
        SelfAttention(H, N, 0.1, 0.02, causal=True, attention_implementation="cudnn")
    with pytest.raises(ValueError, match="causal"):
        SelfAttention(H, N, 0.1, 0.02, causal=True, attention_implementation="cudnn_btnh")
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        attention_hlo("cudnn", precision="float32")
    with pytest.raises(ValueError, match="packed rows"):
        attention_hlo("cudnn", mask=tf.ones((B, S, S), tf.int32))
    with pytest.raises(ValueError, match="head size of at most 128"):
        fused_attention.check_supported(12, tf.bfloat16)


@pytest.mark.parametrize("implementation", ["cudnn", "cudnn_btnh"])
def test_pretrainer_step_calls_cudnn_in_every_block_and_the_last_block_on_its_queries_only(implementation):
    config = BertConfig(vocab_size=50, hidden_size=H, num_hidden_layers=2, num_attention_heads=N,
                        intermediate_size=64, max_position_embeddings=S)
    keras.utils.set_random_seed(0)
    with dtype_policy("bfloat16"):
        model = BertPretrainer(config, encoder=BertEncoder(config, attention_implementation=implementation),
                               skip_padding=False)
    assert BertEncoder.from_config(model.encoder.get_config()).attention_implementation == implementation
    preds = 3
    batch = dict(input_ids=tf.ones((B, S), tf.int32), input_mask=tf.constant([[1] * S, [1] * 6 + [0] * 2]),
                 segment_ids=tf.zeros((B, S), tf.int32), masked_lm_positions=tf.constant([[1, 2, 3], [1, 4, 0]]),
                 masked_lm_ids=tf.ones((B, preds), tf.int32), masked_lm_weights=tf.constant([[1.0] * 3, [1, 1, 0]]),
                 next_sentence_labels=tf.zeros((B, 1), tf.int32))

    @tf.function(jit_compile=True, autograph=False)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = model(batch, training=True)["loss"]
        return tape.gradient(loss, model.trainable_variables)

    calls = custom_calls(step.experimental_get_compiler_ir(batch)(stage="hlo"))
    forward = [c for c in calls if not c[0].endswith("Backward")]
    assert [c[0] for c in forward] == ["__cudnn$fmhaSoftmaxDropout"] * 2 and len(calls) == 4
    # the last block attends from [CLS] and the masked positions (1 + preds queries) over all S keys
    dims = sorted(tuple(c[3]["cudnn_fmha_backend_config"]["intermediate_tensor_shape"]["dimensions"]) for c in forward)
    assert dims == sorted([(str(B), str(N), str(S), str(S)), (str(B), str(N), str(1 + preds), str(S))])
    assert len({c[3]["cudnn_fmha_backend_config"]["seed"] for c in forward}) == 2  # one seed per layer


# --------------------------------------------------------------- the configuration, as XLA reads it
def _file_descriptors(library: bytes, name: str):
    """The serialized FileDescriptorProtos named `name` embedded in a shared library (protobuf's generated
    code keeps each .proto's descriptor as bytes): from the name field on, as long as fields parse."""
    from google.protobuf import descriptor_pb2

    def varint(i):
        value = shift = 0
        while True:
            byte = library[i]
            value, shift, i = value | (byte & 0x7F) << shift, shift + 7, i + 1
            if not byte & 0x80:
                return value, i

    key = name.encode()
    start = library.find(b"\x0a" + bytes([len(key)]) + key)
    while start >= 0:
        i = start
        while i < len(library):
            tag, j = varint(i)
            if not 0 < tag >> 3 <= 20 or tag & 7 not in (0, 2):
                break
            value, j = varint(j)
            i = j if tag & 7 == 0 else j + value
        descriptor = descriptor_pb2.FileDescriptorProto()
        descriptor.ParseFromString(library[start:i])
        if descriptor.message_type or descriptor.enum_type:
            return descriptor
        start = library.find(b"\x0a" + bytes([len(key)]) + key, start + 1)
    raise LookupError(name)


def test_backend_config_parses_as_tensorflows_own_gpu_backend_config():
    """XLA reads the custom call's JSON into its GpuBackendConfig proto: parsed here strictly (an unknown
    field or enum value fails) against that proto as TensorFlow's own library holds it."""
    import os

    from google.protobuf import descriptor_pool, json_format, message_factory

    with open(os.path.join(os.path.dirname(tf.__file__), "libtensorflow_framework.so.2"), "rb") as f:
        library = f.read()
    pool, added = descriptor_pool.DescriptorPool(), set()

    def add(name):
        if name in added:
            return
        added.add(name)
        if name.startswith("google/protobuf/"):
            from google.protobuf import descriptor_pb2

            descriptor = descriptor_pb2.FileDescriptorProto()
            descriptor_pool.Default().FindFileByName(name).CopyToProto(descriptor)
        else:
            descriptor = _file_descriptors(library, name)
            for dependency in descriptor.dependency:
                add(dependency)
        pool.Add(descriptor)

    add("xla/service/gpu/backend_configs.proto")
    config_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("xla.gpu.GpuBackendConfig"))
    mask_kinds = pool.FindEnumTypeByName("xla.gpu.CudnnfMHABackendConfig.MaskType").values_by_name
    for layout in ("BNTH", "BTNH"):
        for backward in (False, True):
            text = fused_attention.backend_config(B, N, 4, S, tf.bfloat16, 0.25, 0.1, 7, backward, layout)
            config = json_format.Parse(text, config_class()).cudnn_fmha_backend_config
            assert config.mask_type == mask_kinds["PADDING"].number and config.is_flash_attention
            assert list(config.intermediate_tensor_shape.dimensions) == [B, N, 4, S] and config.seed == 7
            assert config.dropout_rate == pytest.approx(0.1) and config.fmha_scale == pytest.approx(0.25)
            dots = config.bmm1_grad_gemm1_dot_dimension_numbers if backward else config.bmm1_dot_dimension_numbers
            lhs_contracting, rhs_contracting, lhs_batch, rhs_batch = JAX_DOTS[layout][
                "bmm1_grad_gemm1" if backward else "bmm1"]
            assert list(dots.lhs_batch_dimensions) == lhs_batch and list(dots.rhs_batch_dimensions) == rhs_batch
            assert list(dots.lhs_contracting_dimensions) == [lhs_contracting]
            assert list(dots.rhs_contracting_dimensions) == [rhs_contracting]


# --------------------------------------------------------------- the padded rows, zeroed after each call
@pytest.mark.parametrize("layout", ["BNTH", "BTNH"])
def test_padded_rows_are_selected_to_zero_after_the_forward_and_backward_calls(layout):
    """TF 2.20's cuDNN thunk leaves the padded rows of O, dQ, dK, dV as the buffer held them: each such
    output of a custom call (in BTNH, its transpose to [B, S, N, D]) is the value operand of a select
    (tf.where) whose mask runs along the sequence axis, and the backward reads the masked O."""
    hlo = attention_hlo(IMPLEMENTATIONS[layout])
    # (instruction names differ between TensorFlow releases: custom-call.3 in 2.20, XlaCustomCallV2.9 in 2.21)
    calls = dict(re.findall(r"%(\S+) = .* custom-call\(.*custom_call_target=\"([^\"]+)\"", hlo))
    elements = {}  # get-tuple-element name -> (custom call, index)
    for name, call, index in re.findall(r"%(\S+) = .* get-tuple-element\(.* %(\S+)\), index=(\d)", hlo):
        if call in calls:
            elements[name] = (calls[call], int(index))
    if layout == "BTNH":  # the results reach the selects through one transpose each
        for name, source in re.findall(r"%(\S+) = \S+ transpose\(\S+ %(\S+)\), dimensions=\{0,2,1,3\}", hlo):
            if source in elements:
                elements[name] = elements.pop(source)
    instructions = dict(re.findall(r"%(\S+) = (.*)", hlo))
    selected = {}  # select name -> the (call, index) it masks
    for name, predicate, value in re.findall(r"%(\S+) = \S+ select\(\S+ %(\S+), \S+ %(\S+?), ", hlo):
        if value in elements:
            selected[name] = elements[value]
            # the mask [B, S] broadcast along the batch and the sequence axis (2 in BNTH, 1 in BTNH)
            mask = re.search(rf"broadcast\(pred\[{B},{S}\]\S* %\S+\), dimensions=\{{(\d),(\d)\}}",
                             instructions[predicate])
            assert mask and mask.groups() == ("0", str(fused_attention.SEQUENCE_AXIS[layout])), instructions[predicate]
    assert sorted(selected.values()) == [("__cudnn$fmhaSoftmaxDropout", 0)] + [
        ("__cudnn$fmhaSoftmaxDropoutBackward", i) for i in range(3)]
    (masked_out,) = [s for s, v in selected.items() if v == ("__cudnn$fmhaSoftmaxDropout", 0)]
    backward = re.search(r"custom-call\((.*?)\), custom_call_target=\"__cudnn\$fmhaSoftmaxDropoutBackward", hlo).group(1)
    assert f"%{masked_out}" in backward.split(", ")[5]  # (Q, K, V, stats, dO, O, lengths): O is the masked one


def test_zero_beyond_makes_rows_past_each_length_exactly_zero_even_where_they_held_nan():
    x = np.arange(2 * 1 * 4 * 3, dtype=np.float32).reshape(2, 1, 4, 3) + 1
    x[0, 0, 3] = np.nan
    x[1, 0, 1:] = np.inf
    for dtype in (tf.float32, tf.bfloat16):
        out = fused_attention.zero_beyond(tf.cast(x, dtype), tf.constant([2, 1])).numpy().astype(np.float32)
        np.testing.assert_array_equal(out[0, 0, :2], x[0, 0, :2])
        np.testing.assert_array_equal(out[1, 0, :1], x[1, 0, :1])
        assert (out[0, 0, 2:] == 0).all() and (out[1, 0, 1:] == 0).all() and np.isfinite(out).all()
    full = fused_attention.zero_beyond(tf.constant(x[:1]), tf.constant([4])).numpy()
    np.testing.assert_array_equal(np.isnan(full), np.isnan(x[:1]))  # a full row is left as it is


def test_zero_beyond_on_the_btnh_sequence_axis():
    x = np.arange(2 * 4 * 3 * 2, dtype=np.float32).reshape(2, 4, 3, 2) + 1  # [B, L, N, D]
    x[1, 2] = np.nan
    out = fused_attention.zero_beyond(tf.constant(x), tf.constant([3, 2]), axis=1).numpy()
    np.testing.assert_array_equal(out[0, :3], x[0, :3])
    np.testing.assert_array_equal(out[1, :2], x[1, :2])
    assert (out[0, 3:] == 0).all() and (out[1, 2:] == 0).all()
