"""benchmarks/trace_summary.py: a trace's time by kernel class, on hand-made Chrome traces (exact) and on a
TensorFlow profile of a small step with our optimizer, taken here on the CPU."""

import gzip
import json

import pytest
from conftest import benchmark_module

trace_summary = benchmark_module("trace_summary")


def _chrome(path, events):
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return str(path)


def _x(name, ts, dur, cat="kernel", tid=7):
    return dict(ph="X", name=name, ts=ts, dur=dur, cat=cat, pid=1, tid=tid)


def test_gpu_kernels_by_class_with_idle_gaps(tmp_path):
    path = _chrome(tmp_path / "hf.json.gz", [
        _x("sm90_xmma_gemm_bf16bf16_bf16f32", 0, 10),
        _x("pytorch_flash::flash_fwd_kernel", 12, 8),
        _x("triton_per_fused_add_native_layer_norm_3", 20, 4),
        _x("void at::native::fused_adamw_kernel", 24, 5, tid=8),  # another stream, overlapping the next
        _x("Memcpy HtoD (Pageable -> Device)", 26, 2, cat="gpu_memcpy"),
        _x("nvjet_hsh_256x128_2x1_v_bz_coopA_NTN", 36, 4),
        _x("aten::addmm", 0, 40, cat="cpu_op"),  # host ops are ignored when the trace has device kernels
        dict(ph="i", name="marker", ts=3, cat="kernel"),
    ])
    s = trace_summary.summarise(path, steps=2)
    us = {c: v["us"] for c, v in s["classes"].items()}
    assert s["where"] == "device" and s["span_us"] == 20.0  # 40 us over 2 steps
    assert us == dict(matmul=7.0, attention=4.0, elementwise=2.0, optimizer=2.5, copies=1.0, other=0.0)
    assert s["idle_us"] == pytest.approx((2 + 7) / 2)  # 10-12 and 29-36: no kernel on any stream
    assert s["classes"]["matmul"]["kernels"] == 2 and s["classes"]["matmul"]["share"] == pytest.approx(14 / 40)
    assert s["classes"]["matmul"]["top"][0] == ["sm90_xmma_gemm_bf16bf16_bf16f32", 5.0]


def test_host_ops_count_their_own_time(tmp_path):
    """Without device kernels: torch.profiler's cpu_op events, a parent's time less its children's."""
    path = _chrome(tmp_path / "cpu.json.gz", [
        _x("aten::linear", 0, 10, cat="cpu_op"), _x("aten::t", 0, 1, cat="cpu_op"),
        _x("aten::addmm", 1, 8, cat="cpu_op"), _x("aten::gelu", 10, 3, cat="cpu_op"),
        _x("aten::_fused_adamw_", 20, 5, cat="cpu_op", tid=9),
    ])
    s = trace_summary.summarise(path)
    us = {c: v["us"] for c, v in s["classes"].items()}
    assert s["where"] == "host ops"
    assert us == dict(matmul=9.0, attention=0.0, elementwise=3.0, optimizer=5.0, copies=1.0, other=0.0)
    assert s["idle_us"] == 7.0 and s["span_us"] == 25.0


@pytest.mark.parametrize("name, op, cls", [
    ("loop_add_fusion", "encoder/layer_0/attention/Softmax", "attention"),
    ("input_reduce_fusion_3", "a_inference_optimizer_group_update_0__.12", "optimizer"),
    ("multiply_add_fusion", "", "elementwise"),
    ("SparseSoftmaxCrossEntropyWithLogits", "", "elementwise"),
    ("AssignVariableOp", "while/adamw/AssignVariableOp_3", "optimizer"),
    ("ReadVariableOp", "encoder/layer_norm/ReadVariableOp", "other"),
    ("_MklTranspose", "", "copies"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "", "attention"),
])
def test_classes_by_name_then_op(name, op, cls):
    assert trace_summary.classify(name, op) == cls


def test_tensorflow_profile_of_a_step_with_our_optimizer(tmp_path, capsys):
    import tensorflow as tf

    from bert_tf.training import optimizer as optimizer_lib

    weights = [tf.Variable(tf.random.normal((64, 64))) for _ in range(3)]
    optimizer = optimizer_lib.create_optimizer("adamw", weights, 1e-3, 10)
    x = tf.random.normal((32, 64))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            h = x
            for w in weights:
                h = tf.nn.gelu(tf.matmul(h, w))
            loss = tf.reduce_sum(tf.nn.softmax(tf.transpose(h)))
        optimizer.apply_gradients(tape.gradient(loss, weights))

    step()
    tf.profiler.experimental.start(str(tmp_path))
    step()
    tf.profiler.experimental.stop()
    s = trace_summary.summarise(str(tmp_path))  # the folder: the newest .xplane.pb under it
    assert s["source"].endswith(".xplane.pb") and s["where"] == "host ops"
    for cls in ("matmul", "attention", "elementwise", "optimizer", "copies"):
        assert s["classes"][cls]["kernels"] > 0, cls
    # The update runs as XLA programs named optimizer_group_update_*: their fusions are the update's.
    assert any("fusion" in n for n, _ in s["classes"]["optimizer"]["top"])
    assert 0 <= s["idle_us"] < s["span_us"]
    trace_summary.main([str(tmp_path), "--steps=1"])
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[0] == "class" and "optimizer" in out


def test_missing_trace_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        trace_summary.main([str(tmp_path)])
    assert str(e.value) == f"trace_summary: {tmp_path}: no *.xplane.pb or Chrome trace (.json, .json.gz) under it"
