"""benchmarks/bench_finetuning.py --gpu (run here on CPU with --tiny) and benchmarks/check_device_agreement.py:
the harness a GPU session runs in one command writes its table and numbers where it is told."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, benchmark_module


@pytest.mark.slow
def test_gpu_mode_runs_ours_and_hugging_face_on_both_tasks_and_writes_its_results(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OUT=str(out))
    result = subprocess.run(
        [sys.executable, "benchmarks/bench_finetuning.py", "--gpu", "--tiny", "--examples=128", "--batch=8",
         "--warmup_steps=2", "--steps=1", "--rounds=2", "--variants=ours-buckets,ours-packed,hf-eager"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((out / "bench_finetuning_gpu.json").read_text())
    runs = {(r["task"], r["variant"]): r for r in saved["results"]}
    # SQuAD's windows are not packed; every other pair ran, on the CPU here (named beside each figure).
    assert set(runs) == {("glue", "ours-buckets"), ("glue", "ours-packed"), ("glue", "hf-eager"),
                         ("squad", "ours-buckets"), ("squad", "hf-eager")}
    for r in runs.values():
        assert r["device"] == "CPU" and r["examples_per_s"] > 0 and len(r["rates"]) == 2
        assert r["compile_seconds"] >= 0 and 0 < r["real_share"] <= 1
    assert len(runs["glue", "ours-buckets"]["shapes"]) <= 4 and runs["glue", "ours-buckets"]["shapes"][-1] <= 128
    assert runs["squad", "ours-buckets"]["shapes"][-1] <= 384
    # packed rows are nearly all real tokens; the length buckets well above padding to max_seq_length
    assert runs["glue", "ours-packed"]["real_share"] > 0.9
    mean = saved["mixes"]["glue"]["mean_length"]
    assert runs["glue", "ours-buckets"]["real_share"] > 1.5 * mean / 128
    table = (out / "bench_finetuning_gpu.md").read_text()
    assert "| glue | ours-buckets | CPU |" in table and "| squad | hf-eager | CPU |" in table


def test_device_agreement_verdict_uses_the_cpu_noise():
    check = benchmark_module("check_device_agreement")

    def runs(accuracies):
        return {seed: dict(eval_accuracy=a, eval_loss=0.4, seconds=1.0, hardware="x")
                for seed, a in enumerate(accuracies, start=1)}

    cpu = runs([0.83, 0.84, 0.8225, 0.83, 0.84])  # the recorded CPU runs' spread: sd 0.0075
    close = check.compare(dict(gpu=runs([0.835, 0.8275, 0.84]), cpu=cpu))
    assert close["verdict"]["agree"] and close["verdict"]["bound"] == pytest.approx(2 * 0.0075 * (1 / 3 + 1 / 5) ** 0.5,
                                                                                     rel=0.01)
    worse = check.compare(dict(gpu=runs([0.80, 0.81, 0.805]), cpu=cpu))
    assert not worse["verdict"]["agree"] and worse["verdict"]["difference"] < 0
    assert "verdict" not in check.compare(dict(cpu=cpu))  # nothing to compare with
    recorded = json.loads((REPO / "benchmarks" / "device_agreement_cpu.json").read_text())
    assert len(recorded["runs"]["cpu"]) >= 3 and recorded["summary"]["cpu"]["sd"] > 0
