"""The environment report (python -m bert_tf.env): its sections, the oneDNN ISA cap, the verdicts."""

import json
import subprocess
import sys

import pytest
import tensorflow as tf
from absl import flags
from conftest import REPO

from bert_tf import env

pytestmark = pytest.mark.slow

ALL_ISA = {name: True for name in env.ISA_FLAGS.values()}
AVX2_ONLY = {name: name in ("AVX2", "FMA") for name in env.ISA_FLAGS.values()}  # e.g. AMD Zen 3


def test_report_has_every_section_on_a_machine_without_gpu_or_tpu():
    report = env.report()
    assert set(report) == {"versions", "cpu", "onednn", "gpus", "tpu", "xla", "int8_serving", "bfloat16", "gcs"}
    assert report["versions"]["tensorflow"] == tf.__version__
    assert set(report["versions"]) >= {"python", "tensorflow", "keras", "tensorflow_text", "numpy"}
    assert report["gpus"] == [{"name": d.name, "device_name": report["gpus"][i]["device_name"],
                               "compute_capability": report["gpus"][i]["compute_capability"],
                               "memory_mib": report["gpus"][i]["memory_mib"]}
                              for i, d in enumerate(tf.config.list_physical_devices("GPU"))]
    assert report["tpu"]["cores"] == len(tf.config.list_physical_devices("TPU"))
    assert report["xla"] == {"available": True, "detail": "a jit_compile function ran"}
    assert report["int8_serving"]["verdict"] in ("fast", "runs", "unavailable")
    assert isinstance(report["bfloat16"]["pays"], bool)
    assert report["gcs"]["gs_registered"] == ("gs" in tf.io.gfile.get_registered_schemes())
    line = env.summary_line(report)
    assert "\n" not in line and line.startswith(f"env: TF {tf.__version__}, ")
    text = env.report_text(report)
    for title in ("versions:", "cpu isa:", "onednn:", "gpus:", "tpu:", "xla:", "int8 serving:", "bfloat16:", "gs://:"):
        assert title in text


def test_cpu_info_reads_the_isa_flags_and_degrades_without_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_1 avx avx2 fma\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_1 avx avx2 fma\n")
    info = env.cpu_info(str(cpuinfo))
    assert info["model"] == "AMD EPYC 7B13"
    assert info["isa"] == AVX2_ONLY
    assert env.cpu_info(str(tmp_path / "missing"))["isa"] is None


@pytest.mark.parametrize("cap, used", [
    (None, list(env.ISA_FLAGS.values())),
    ("AVX2", ["AVX2", "FMA"]),
    ("avx512_core_vnni", ["AVX2", "FMA", "AVX512F", "AVX512_VNNI"]),
    ("AVX512_CORE_AMX", list(env.ISA_FLAGS.values())),
])
def test_onednn_uses_only_what_onednn_max_cpu_isa_allows(monkeypatch, cap, used):
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    info = env.onednn_info(ALL_ISA)
    assert info["isa_used"] == used
    assert info["isa_capped_away"] == [name for name in env.ISA_FLAGS.values() if name not in used]
    assert info["ONEDNN_MAX_CPU_ISA"] == cap


def test_int8_and_bfloat16_verdicts_follow_the_isa_onednn_may_use(monkeypatch):
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    if env.report()["int8_serving"]["verdict"] == "unavailable":
        pytest.skip("this TensorFlow has no oneDNN int8 matmul")
    full = env.onednn_info(ALL_ISA)
    assert env.int8_info(full)["verdict"] == "fast"
    assert env.bfloat16_info(full)["pays"] is full["enabled"]
    zen3 = env.onednn_info(AVX2_ONLY)
    assert env.int8_info(zen3) == {"verdict": "runs", "detail": "the int8 kernel runs without int8 dot products "
                                   "(no VNNI or AMX-INT8 on this CPU): slow, u8 x s8 products summed in pairs in 16 bits"}
    assert env.bfloat16_info(zen3)["pays"] is False
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # an AMX machine running the AVX2 kernels
    capped = env.onednn_info(ALL_ISA)
    assert env.int8_info(capped)["verdict"] == "runs"
    assert "capped away by ONEDNN_MAX_CPU_ISA=AVX2" in env.int8_info(capped)["detail"]
    bf16 = env.bfloat16_info(capped)
    assert bf16["pays"] is False
    assert bf16["detail"].startswith("AMX_BF16, AVX512_BF16 capped away by ONEDNN_MAX_CPU_ISA; TF 2.20 crashes")


def test_command_line_prints_json_and_text():
    result = subprocess.run([sys.executable, "-m", "bert_tf.env", "--json"], capture_output=True, text=True,
                            cwd=str(REPO), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["versions"]["tensorflow"] == tf.__version__
    assert report["xla"]["available"] is True
    assert "Compiled cluster using XLA" not in result.stderr  # the probe's own notice is held back


def test_run_flags_are_the_programs_own_once_parsed():
    values = flags.FlagValues()
    flags.DEFINE_string("output_dir", None, "", flag_values=values, module_name="run_classifier.py")
    flags.DEFINE_integer("seed", 1, "", flag_values=values, module_name="bert_flags")
    flags.DEFINE_float("delta_threshold", 0.5, "", flag_values=values,
                       module_name="tensorflow.python.tpu.tensor_tracer_flags")
    flags.DEFINE_bool("logtostderr", False, "", flag_values=values, module_name="absl.logging")
    assert env.run_flags(values) == {}
    values(["run_classifier.py", "--output_dir=gs://b/out", "--logtostderr"])
    assert env.run_flags(values) == {"output_dir": "gs://b/out", "seed": 1}
