"""benchmarks/bench_pretraining.py: real records (padded and packed) reach every variant unchanged and in file order;
the GPU run's bookkeeping (device, compile seconds, real tokens/s, peaks) checked on the CPU."""

import argparse

import numpy as np
import pytest
from conftest import benchmark_module

from bert_tf.data import schema
from bert_tf.errors import InputDataError

pytestmark = pytest.mark.slow

SEQ, PRED, BATCH = 16, 3, 4


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """10 records; record i has 5 + i real tokens, ids 100 * i + position, 2 predictions."""
    path = str(tmp_path_factory.mktemp("bench") / "data.tfrecord")
    enc = schema.PretrainingRecordEncoder(SEQ, PRED, vocab_size=30522)
    writer = schema.RecordFileWriter(path)
    for i in range(10):
        n = 5 + i
        ids = [100 * i + p for p in range(n)] + [0] * (SEQ - n)
        writer.write(schema.frame_record(enc.encode(ids, n, 3, [1, 2, 0], [7, 8 + i, 0], 2, i % 2)))
    writer.close()
    return path


def test_real_batches_keep_file_order_shapes_and_padding(records, tmp_path):
    bench = benchmark_module("bench_pretraining")
    out = str(tmp_path / "batches.npz")
    info = bench.read_real_batches(records, BATCH, 2, out)
    real = sum(5 + i for i in range(8))  # two full batches of 4; the last 2 records are left over
    assert info == dict(seq=SEQ, preds=PRED, padding=pytest.approx(1 - real / (8 * SEQ)), distinct_rows=2)

    args = argparse.Namespace(batches_file=out, batch=BATCH, seq=SEQ, preds=PRED, steps=2)
    batches = bench._batches(args)
    assert len(batches) == 2
    second = batches[1]
    assert second["input_ids"].shape == (BATCH, SEQ) and second["masked_lm_ids"].shape == (BATCH, PRED)
    assert second["next_sentence_labels"].shape == (BATCH, 1)
    np.testing.assert_array_equal(second["input_ids"][:, 1], [401, 501, 601, 701])  # records 4-7, in order
    np.testing.assert_array_equal(second["input_mask"].sum(1), [9, 10, 11, 12])
    np.testing.assert_array_equal(second["masked_lm_ids"][:, 1], [12, 13, 14, 15])
    np.testing.assert_array_equal(second["masked_lm_weights"][0], [1.0, 1.0, 0.0])


def test_real_batches_refuse_too_little_data(records, tmp_path):
    with pytest.raises(InputDataError, match=r"2 full batches of 4, the run needs 3"):
        benchmark_module("bench_pretraining").read_real_batches(records, BATCH, 3, str(tmp_path / "b.npz"))
    assert not (tmp_path / "b.npz").exists()


def test_packed_real_batches_hold_every_record_once(records, tmp_path):
    bench = benchmark_module("bench_pretraining")
    padded, packed = str(tmp_path / "batches.npz"), str(tmp_path / "packed.npz")
    info = bench.read_real_batches(records, BATCH, 2, padded, packed)
    rows = dict(np.load(packed))
    assert rows["sequence_ids"].shape == (2, BATCH, SEQ) and "input_mask" not in rows
    # Evaluation-mode packing keeps every instance: all 10 records' tokens, none twice.
    assert sum(bench.real_tokens({k: v[i] for k, v in rows.items()}) for i in range(2)) == sum(5 + i for i in range(10))
    assert info["packed_padding"] == pytest.approx(1 - 95 / (2 * BATCH * SEQ))
    assert info["padding"] == pytest.approx(1 - sum(5 + i for i in range(8)) / (2 * BATCH * SEQ))


def test_timed_tokens_compile_seconds_and_peaks():
    bench = benchmark_module("bench_pretraining")
    batches = [dict(input_mask=np.ones((2, 8), np.int32) * (i + 1) * (np.arange(8) < 3 + i)) for i in range(2)]
    # Synthetic: `steps` batches cycled; 2 timed calls of 2 steps see each batch twice.
    assert bench.timed_real_tokens(batches, 2, 2) == 2 * (2 * 3 + 2 * 4)
    six = [dict(sequence_ids=np.full((1, 4), i % 2)) for i in range(6)]  # real records: new batch per step
    assert bench.timed_real_tokens(six, 2, 2) == 2 * 4  # batches 2..5, two of them real
    assert bench.compile_seconds(10.0, [2.0, 4.0]) == 7.0
    assert bench.compile_seconds(1.0, [2.0]) == 0.0
    peaks = {"peak-bf16": dict(flops=5.0), "torchpeak-bf16": dict(flops=7.0), "peak-fp16": None}
    assert bench.hardware_peak(peaks, "bf16") == 7.0 and bench.hardware_peak(peaks, "fp16") is None
    gpu = argparse.Namespace(device="gpu")
    assert bench.peak_names(gpu, bench.GPU_VARIANTS) == ["peak-bf16", "peak-fp16", "torchpeak-bf16"]
    cpu = argparse.Namespace(device="cpu")
    assert bench.peak_names(cpu, ["ours-bf16-xla"]) == ["peak-fp32", "peak-bf16"]


def test_gpu_run_without_a_gpu_is_one_line_error(monkeypatch, capsys, tmp_path):
    bench = benchmark_module("bench_pretraining")
    monkeypatch.setattr(bench, "gpu_name", lambda: None)
    monkeypatch.setattr("sys.argv", ["bench_pretraining.py", "--device=gpu", f"--out_dir={tmp_path}/out"])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 2 and "--device=gpu: nvidia-smi lists no GPU" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("impl", ["ours", "hf"])
def test_worker_reports_device_compile_and_real_token_rate(impl, tmp_path):
    """The variants' own code path (the one a GPU run takes, on the CPU): a tiny model, 2 timed steps,
    then one profiled step (--profile) whose trace lands in the variant's profile folder."""
    bench = benchmark_module("bench_pretraining")
    args = argparse.Namespace(size="tiny", batch=2, seq=16, preds=2, steps=1, loops=2, batches_file=None, device="cpu",
                              profile_dir=str(tmp_path / impl))
    if impl == "hf":
        r = bench.run_hf(args, bf16=True, compile_=False)
        trace = tmp_path / "hf" / "trace.json.gz"
    else:
        r = bench.run_ours(args, "bfloat16", xla=False)
        (trace,) = (tmp_path / "ours").glob("plugins/profile/*/*.xplane.pb")
    tokens = bench.timed_real_tokens(bench.synthetic_batches(2, 16, 2, num=1), 1, 2)
    # Both rates come from the same timed seconds: their ratio is the timed batches' real tokens per sequence.
    assert r["real_tokens_per_s"] / r["seq_per_s"] == pytest.approx(tokens / (2 * 2 * 1))
    assert r["device"] == bench.cpu_name() and r["params"] > 0
    assert r["first_call_s"] >= r["compile_s"] >= 0 and np.isfinite(r["loss"])
    summary = benchmark_module("trace_summary").summarise(str(tmp_path / impl))
    assert summary["source"] == str(trace) and summary["classes"]["matmul"]["kernels"] > 0


def test_gpu_candidate_variants_parse_and_set_their_xla_flags():
    bench = benchmark_module("bench_pretraining")
    assert bench.split_variant("ours-bf16-xla+cudnn+cb_off") == ("ours-bf16-xla", ["cudnn", "cb_off"])
    assert bench.variant_error("ours-bf16-xla+cudnn+whole+adrop0+triton_off") is None
    assert bench.variant_error("ours-bf16-xla+flash") == (
        "ours-bf16-xla+flash: unknown option(s) flash; expected some of cudnn, btnh, whole, adrop0, noclock, devfeed, "
        "k8, plain_epilogues, cb_off, cb_fusion, triton_off, cublaslt, cudnn_ln, gpu_private")
    assert bench.variant_error("hf-bf16-compile+cb_off") == "hf-bf16-compile+cb_off: options apply to ours-*-xla variants only"
    assert bench.variant_error("ours-bf16-graph+whole") == "ours-bf16-graph+whole: options apply to ours-*-xla variants only"
    assert bench.variant_error("ours-int8-xla") == "unknown variant ours-int8-xla"
    assert bench.variant_error("ours-bf16-xla+k8") == "ours-bf16-xla+k8: k8 runs whole steps in one program: it needs +whole"
    assert bench.variant_error("ours-bf16-xla+whole+k8") is None
    assert [bench.steps_per_program(o) for o in (["whole", "k8"], ["whole", "devfeed"])] == [8, 1]
    # the profiled call: whole programs (a +k8 variant's is one program of 8 steps)
    profiled = argparse.Namespace(steps=20, profile_dir="p")
    assert (bench.profile_steps(profiled), bench.profile_steps(profiled, 8), bench.profile_steps(
        argparse.Namespace(steps=3, profile_dir="p"), 8), bench.profile_steps(argparse.Namespace(steps=20))) == (8, 8, 8, 0)
    # The presets' flags join the environment's (on_gpu.sh puts --xla_gpu_cuda_data_dir there); model options add none.
    assert bench.xla_flags("ours-bf16-xla+cudnn+cb_off+cublaslt", "--xla_gpu_cuda_data_dir=/cuda") == (
        "--xla_gpu_cuda_data_dir=/cuda --xla_gpu_enable_command_buffer= --xla_gpu_enable_cublaslt=true")
    assert bench.xla_flags("ours-bf16-xla", "") == ""
    # +gpu_private: an environment variable of the variant's process, no XLA flag
    env = bench.variant_env({"XLA_FLAGS": ""}, "ours-bf16-xla+gpu_private+noclock")
    assert env["TF_GPU_THREAD_MODE"] == "gpu_private" and env["XLA_FLAGS"] == ""
    assert "TF_GPU_THREAD_MODE" not in bench.variant_env({}, "ours-bf16-xla+noclock")
    # the report says how each side is fed
    fed = bench.feeding(["ours-bf16-xla", "ours-bf16-xla+devfeed", "hf-bf16-compile"], "gpu")
    assert fed.startswith("ours from a cached tf.data dataset in host memory") and "ours+devfeed prefetched onto the GPU" in fed
    assert fed.endswith("hf with every batch moved to the GPU once, before the first step")
    assert bench.feeding(["ours-bf16-xla+devfeed"], "gpu").startswith("ours+devfeed")
    assert bench.feeding(["ours-bf16-xla+whole+k8"], "gpu") == (
        "ours+devfeed prefetched onto the GPU by tf.distribute (experimental_fetch_to_device), +k8 stacked 8 steps "
        "to an element")
    # The XLA cache: a folder per preset set, so no variant loads a program compiled under other flags.
    env = bench.variant_env(dict(TF_XLA_FLAGS="--tf_xla_auto_jit=0"), "ours-bf16-xla+whole+cb_off+cublaslt", "/c")
    assert env["TF_XLA_FLAGS"] == "--tf_xla_auto_jit=0 --tf_xla_persistent_cache_directory=/c/cb_off+cublaslt"
    assert bench.variant_env({}, "ours-bf16-xla+cudnn", "/c")["TF_XLA_FLAGS"] == (
        "--tf_xla_persistent_cache_directory=/c")
    assert "TF_XLA_FLAGS" not in bench.variant_env({}, "ours-bf16-xla+cb_off")
    base4 = bench.bert_config("base4", attention_probs_dropout_prob=0.0)
    assert (base4.num_hidden_layers, base4.hidden_size, base4.num_attention_heads, base4.intermediate_size) == (
        4, 768, 12, 3072) and base4.attention_probs_dropout_prob == 0.0
    assert bench.peak_names(argparse.Namespace(device="gpu", no_peaks=True), ["ours-bf16-xla"]) == []


def test_bad_candidate_variant_is_one_line_error_before_any_run(monkeypatch, capsys, tmp_path):
    bench = benchmark_module("bench_pretraining")
    monkeypatch.setattr("sys.argv", ["bench_pretraining.py", "--device=cpu", "--variants=ours-bf16-xla+warp",
                                     f"--out_dir={tmp_path}/out"])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 2 and "ours-bf16-xla+warp: unknown option(s) warp" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
