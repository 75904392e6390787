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


def test_cudnn_training_step_holds_forward_and_backward_calls_with_shapes_and_config():
    calls = custom_calls(attention_hlo("cudnn"))
    assert [c[0] for c in calls] == ["__cudnn$fmhaSoftmaxDropout", "__cudnn$fmhaSoftmaxDropoutBackward"]
    (_, fwd_out, fwd_in, fwd), (_, bwd_out, bwd_in, bwd) = calls
    heads = f"bf16[{B},{N},{S},16]"
    # forward: (Q, K, V, q lengths, kv lengths) -> (O, softmax statistics, workspace)
    assert fwd_out.startswith(f"({heads},f32[{B},{N},{S}],u8[0])")
    assert fwd_in.count(heads) == 3 and fwd_in.count(f"s32[{B}]") == 2
    # backward: (Q, K, V, statistics, dO, O, lengths) -> (dQ, dK, dV, workspace)
    assert bwd_out.startswith(f"({heads},{heads},{heads},u8[0])")
    assert bwd_in.count(heads) == 5 and f"f32[{B},{N},{S}]" in bwd_in and bwd_in.count(f"s32[{B}]") == 2
    for config, dots in ((fwd, fused_attention._FORWARD_DOTS), (bwd, fused_attention._BACKWARD_DOTS)):
        c = config["cudnn_fmha_backend_config"]
        assert c["is_flash_attention"] and c["mask_type"] == "PADDING"
        assert c["fmha_scale"] == pytest.approx(0.25) and c["dropout_rate"] == pytest.approx(0.1)
        assert c["intermediate_tensor_shape"]["dimensions"] == [str(d) for d in (B, N, S, S)]
        assert c["intermediate_tensor_shape"]["element_type"] == "BF16"
        assert {k: (int(v["lhs_contracting_dimensions"][0]), int(v["rhs_contracting_dimensions"][0]))
                for k, v in c.items() if k.endswith("dot_dimension_numbers")} == dots
    assert fwd["cudnn_fmha_backend_config"]["seed"] == bwd["cudnn_fmha_backend_config"]["seed"]


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
    for implementation in ("xla", "cudnn"):
        keras.utils.set_random_seed(3)
        with dtype_policy("bfloat16"):
            layer = SelfAttention(H, N, 0.1, 0.02, attention_implementation=implementation)
            layer.build()
        outputs.append(layer(x, mask, training=False).numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_cudnn_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="attention_implementation must be one of xla, cudnn"):
        SelfAttention(H, N, 0.1, 0.02, attention_implementation="flash")
    with pytest.raises(ValueError, match="causal"):
        SelfAttention(H, N, 0.1, 0.02, causal=True, attention_implementation="cudnn")
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        attention_hlo("cudnn", precision="float32")
    with pytest.raises(ValueError, match="packed rows"):
        attention_hlo("cudnn", mask=tf.ones((B, S, S), tf.int32))
    with pytest.raises(ValueError, match="head size of at most 128"):
        fused_attention.check_supported(12, tf.bfloat16)


def test_pretrainer_step_calls_cudnn_in_every_block_and_the_last_block_on_its_queries_only():
    config = BertConfig(vocab_size=50, hidden_size=H, num_hidden_layers=2, num_attention_heads=N,
                        intermediate_size=64, max_position_embeddings=S)
    keras.utils.set_random_seed(0)
    with dtype_policy("bfloat16"):
        model = BertPretrainer(config, encoder=BertEncoder(config, attention_implementation="cudnn"),
                               skip_padding=False)
    assert BertEncoder.from_config(model.encoder.get_config()).attention_implementation == "cudnn"
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
    for backward in (False, True):
        text = fused_attention.backend_config(B, N, 4, S, tf.bfloat16, 0.25, 0.1, 7, backward)
        config = json_format.Parse(text, config_class()).cudnn_fmha_backend_config
        assert config.mask_type == mask_kinds["PADDING"].number and config.is_flash_attention
        assert list(config.intermediate_tensor_shape.dimensions) == [B, N, 4, S] and config.seed == 7
        assert config.dropout_rate == pytest.approx(0.1) and config.fmha_scale == pytest.approx(0.25)
        dots = config.bmm1_grad_gemm1_dot_dimension_numbers if backward else config.bmm1_dot_dimension_numbers
        assert list(dots.lhs_batch_dimensions) == [0, 1] and list(dots.lhs_contracting_dimensions) == [2 if backward else 3]


# --------------------------------------------------------------- the padded rows, zeroed after each call
def test_padded_rows_are_selected_to_zero_after_the_forward_and_backward_calls():
    """TF 2.20's cuDNN thunk leaves the padded rows of O, dQ, dK, dV as the buffer held them: each such
    output of a custom call is the value operand of a select (tf.where), and the backward reads the masked O."""
    hlo = attention_hlo("cudnn")
    # (instruction names differ between TensorFlow releases: custom-call.3 in 2.20, XlaCustomCallV2.9 in 2.21)
    calls = dict(re.findall(r"%(\S+) = .* custom-call\(.*custom_call_target=\"([^\"]+)\"", hlo))
    elements = {}  # get-tuple-element name -> (custom call, index)
    for name, call, index in re.findall(r"%(\S+) = .* get-tuple-element\(.* %(\S+)\), index=(\d)", hlo):
        if call in calls:
            elements[name] = (calls[call], int(index))
    selected = {}  # select name -> the (call, index) it masks
    for name, value in re.findall(r"%(\S+) = \S+ select\(\S+ %\S+, \S+ %(\S+?), ", hlo):
        if value in elements:
            selected[name] = elements[value]
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
