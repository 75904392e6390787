"""benchmarks/gpu_matrix.py: the GPU session's choices from measured numbers, its budget, and its dry run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, benchmark_module

BASE = benchmark_module("gpu_matrix").BASELINE  # the scripts' GPU default: ours-bf16-xla+whole+cudnn_ln


def test_combination_takes_the_candidates_that_beat_the_baseline_one_per_flag():
    matrix = benchmark_module("gpu_matrix")
    results = {BASE: dict(seq_per_s=100.0), f"{BASE}+cudnn": dict(seq_per_s=110.0),
               f"{BASE}+triton_off": dict(seq_per_s=101.0),  # within NOISE: left out
               f"{BASE}+adrop0": dict(seq_per_s=130.0),  # another recipe: measured only
               f"{BASE}+cb_off": dict(seq_per_s=104.0), f"{BASE}+cb_fusion": dict(seq_per_s=106.0),  # one flag
               f"{BASE}+cublaslt": dict(seq_per_s=90.0)}
    ratios = matrix.speedups(results)
    assert ratios[f"{BASE}+cudnn"] == pytest.approx(1.1) and ratios[BASE] == 1.0
    assert matrix.choose_combination(ratios) == ["cudnn", "cb_fusion"]
    assert matrix.variant(["cudnn", "cb_fusion"]) == f"{BASE}+cudnn+cb_fusion"
    # The winner: against its own run's baseline, never a measured-only option.
    assert matrix.winner({**ratios, f"{BASE}+cudnn+cb_fusion": 1.15}) == f"{BASE}+cudnn+cb_fusion"
    assert matrix.winner(ratios) == f"{BASE}+cudnn"
    assert matrix.winner({}) == BASE and matrix.speedups({f"{BASE}+cudnn": dict(seq_per_s=1.0)}) == {}
    assert matrix.choose_combination({BASE: 1.0, f"{BASE}+triton_off": 0.99}) == []
    assert matrix.options_of(f"{BASE}+cudnn+cb_fusion") == ["cudnn", "cb_fusion"] and matrix.options_of(BASE) == []


def test_k8_follows_the_host_gap_candidates_and_combines_with_them():
    matrix = benchmark_module("gpu_matrix")
    assert matrix.CANDIDATES[:3] == ("noclock", "devfeed", "k8")  # the idle between steps first, by time at stake
    ratios = matrix.speedups({BASE: dict(seq_per_s=100.0), f"{BASE}+noclock": dict(seq_per_s=105.0),
                              f"{BASE}+devfeed": dict(seq_per_s=103.0), f"{BASE}+k8": dict(seq_per_s=112.0)})
    assert matrix.choose_combination(ratios) == ["noclock", "devfeed", "k8"]  # k8 implies devfeed: no conflict
    assert matrix.winner(ratios) == f"{BASE}+k8"
    # Every variant of the matrix runs the same steps per call: whole programs of k8's 8 steps.
    steps = [int(a.split("=")[1]) for a in matrix.GPU_ARGS["matrix"] if a.startswith("--steps=")]
    assert steps == [16]
    assert benchmark_module("bench_pretraining").variant_error(matrix.variant(["k8"])) is None


def test_btnh_and_cudnn_are_one_choice_and_a_failed_dropout_check_keeps_both_from_winning():
    matrix = benchmark_module("gpu_matrix")
    ratios = matrix.speedups({BASE: dict(seq_per_s=100.0), f"{BASE}+cudnn": dict(seq_per_s=105.0),
                              f"{BASE}+btnh": dict(seq_per_s=108.0), f"{BASE}+noclock": dict(seq_per_s=104.0)})
    assert matrix.choose_combination(ratios) == ["noclock", "btnh"]  # the better layout, in CANDIDATES order
    assert matrix.winner(ratios) == f"{BASE}+btnh"
    held = {"adrop0", "cudnn", "btnh"}
    assert matrix.choose_combination(ratios, held) == ["noclock"] and matrix.winner(ratios, held) == f"{BASE}+noclock"
    assert matrix.CANDIDATES.index("btnh") == matrix.CANDIDATES.index("cudnn") + 1


@pytest.mark.parametrize("status, check, kept, held", [
    ("failed", {"agrees": False}, ["noclock"], set()),  # cudnn wrong: neither layout is measured
    ("done", {"agrees": True, "btnh": {"agrees": False}, "dropout_ok": True}, ["noclock", "cudnn"], set()),
    ("done", {"agrees": True, "btnh": {"agrees": True}, "dropout_ok": False,
              "dropout_masks": [{"setting": "command_buffers_default", "ok": False, "differs_between_calls": False,
                                 "keep_fraction": 0.875, "custom_calls": ["x"]}]},
     ["noclock", "cudnn", "btnh"], {"cudnn", "btnh"}),
    ("skipped", {}, ["noclock", "cudnn", "btnh"], set()),
])
def test_the_smoke_checks_verdict_on_the_attention_candidates(tmp_path, status, check, kept, held):
    matrix = benchmark_module("gpu_matrix")
    session = matrix.Session(str(tmp_path), 100)
    if check:
        (tmp_path / "smoke").mkdir()
        (tmp_path / "smoke" / "fused_attention_check.json").write_text(json.dumps(check))
    candidates, measured_only = matrix.attention_verdict(session, status, ["noclock", "cudnn", "btnh"])
    assert candidates == kept and measured_only == matrix.MEASURED_ONLY | held
    records = [json.loads(line) for line in (tmp_path / "session.jsonl").read_text().splitlines()] if check else []
    if check:
        assert records[0]["status"] == "attention checks" and records[0]["cudnn_agrees"] == check["agrees"]
        assert records[0]["dropout_masks"] == [{k: v for k, v in m.items() if k != "custom_calls"}
                                               for m in check.get("dropout_masks", [])]
        assert len(records) == 2 and records[1]["reason"]  # what left or was held, and why


def test_dropout_probe_verdict_from_the_dropped_probabilities():
    check = benchmark_module("check_fused_attention")
    rng = np.random.default_rng(0)
    length, shape = 64, (4, 4, 64, 64)

    def dropped(keep, rate=0.1):  # kept probabilities 1 / (T (1 - rate)), the rest 0
        return (rng.random(shape) < keep) / (length * (1 - rate))

    first, again, other = dropped(0.9), dropped(0.9), dropped(0.9)
    good = check.mask_statistics([first, again, other, dropped(0.9)], length)
    assert good["ok"] and good["differs_between_calls"] and not good["second_function_repeats_first"]
    assert abs(good["keep_fraction"] - 0.9) < 0.005 and good["implied_scale_rate"] == pytest.approx(0.1, abs=1e-6)
    repeated = check.mask_statistics([first, first, first, first], length)  # a CUDA graph replaying one mask
    assert not repeated["ok"] and not repeated["differs_between_calls"] and repeated["second_function_repeats_first"]
    rounded = check.mask_statistics([dropped(0.875, 0.125) for _ in range(4)], length)  # rate rounded to 2/16
    assert not rounded["ok"] and rounded["differs_between_calls"]
    assert rounded["implied_scale_rate"] == pytest.approx(0.125, abs=1e-6)
    hlo = ("%command_buffer.3 (p: bf16[4]) -> bf16[4] {\n  %c = custom-call(), custom_call_target=\"__cudnn$fmhaSoftmaxDropout\"\n}\n"
           "ENTRY %main {\n  %x = call(), to_apply=%command_buffer.3\n}")
    assert check.fmha_in_command_buffer(hlo)
    assert not check.fmha_in_command_buffer(hlo.replace("%command_buffer.3 (", "%fused.3 ("))


def test_result_lines_put_each_ours_variant_beside_the_runs_peer_and_peak(tmp_path):
    matrix = benchmark_module("gpu_matrix")
    common = dict(device="NVIDIA H200", real_tokens_per_s=1000.0)
    lines = [dict(variant=BASE, seq_per_s=100.0, **common), dict(variant="hf-bf16-compile", seq_per_s=125.0, **common),
             dict(variant=f"{BASE}+noclock", seq_per_s=110.0, **common), dict(variant=f"{BASE}+cudnn", failed="x")]
    (tmp_path / "progress.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "results.json").write_text(json.dumps(dict(best={BASE: dict(mfu=0.3)}, data="synthetic")))
    out = {r["variant"]: r for r in matrix.result_lines("base", str(tmp_path), "base batch 256 seq 128", "2026-11-28")}
    assert sorted(out) == [BASE, f"{BASE}+noclock"]  # ours only; the failure has no line
    assert out[BASE] == dict(date="2026-11-28", card="NVIDIA H200", step="base", model="base batch 256 seq 128",
                             variant=BASE, ours_seq_per_s=100.0, hf_seq_per_s=125.0, ratio=0.8, vs_baseline=1.0,
                             share_of_peak=0.3, real_tokens_per_s=1000.0, data="synthetic")
    assert out[f"{BASE}+noclock"]["ratio"] == 0.88 and out[f"{BASE}+noclock"]["share_of_peak"] is None
    assert tuple(out[BASE]) == matrix.RESULT_FIELDS
    assert matrix.model_name(["--device=gpu", "--size=base4", "--batch=256", "--seq=128", "--no_peaks"]) == (
        "base4 batch 256 seq 128")


def test_progress_keeps_each_variants_best_round_and_skips_failures(tmp_path):
    matrix = benchmark_module("gpu_matrix")
    lines = [dict(variant=BASE, round=1, seq_per_s=10.0), dict(variant=BASE, round=2, seq_per_s=12.0),
             dict(variant=f"{BASE}+cudnn", failed="No registered implementation")]
    (tmp_path / "progress.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert matrix.read_progress(str(tmp_path)) == {BASE: lines[1]}
    assert matrix.read_progress(str(tmp_path / "none")) == {}


def test_a_spent_budget_skips_every_step_and_says_so(tmp_path):
    out = tmp_path / "session"
    proc = subprocess.run([sys.executable, "benchmarks/gpu_matrix.py", f"--out_dir={out}", "--budget_s=1"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (out / "session.jsonl").read_text().splitlines()]
    assert [(r["step"], r["status"]) for r in records] == [
        ("smoke", "skipped"), ("matrix", "skipped"), ("combination", "skipped"), ("winner", BASE),
        ("base", "skipped"), ("records", "skipped"), ("finetune", "skipped"), ("accuracy", "skipped"),
        ("session", "end")]
    assert not (out / "gpu_results.jsonl").exists()  # nothing measured, nothing recorded
    assert records[0]["reason"].startswith("125 s expected")
    assert f"winner: {BASE}\n" in (out / "summary.md").read_text()


def test_unknown_step_or_candidate_is_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/gpu_matrix.py", f"--out_dir={tmp_path}/o",
                           "--candidates=cudnn,warp"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "unknown step or candidate warp" in proc.stderr.strip().splitlines()[-1]
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.slow  # two bench_pretraining variants at BERT-tiny under XLA, each in its own process (~90 s)
def test_dry_run_measures_the_matrix_and_names_a_winner(tmp_path):
    out = tmp_path / "dry"
    proc = subprocess.run([sys.executable, "benchmarks/gpu_matrix.py", "--dry_run", f"--out_dir={out}",
                           "--steps=matrix,combination", "--candidates=cb_off", "--budget_s=900"],
                          capture_output=True, text=True, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "session.jsonl").read_text().splitlines()]
    assert [(r["step"], r["status"]) for r in records if r["step"] != "winner"] == [
        ("matrix", "started"), ("matrix", "done"), ("combination", "skipped"), ("session", "end")]
    measured = benchmark_module("gpu_matrix").read_progress(str(out / "matrix"))
    assert sorted(measured) == [BASE, f"{BASE}+cb_off"]
    assert all(r["seq_per_s"] > 0 and r["device"] for r in measured.values())
    (winner,) = [r["status"] for r in records if r["step"] == "winner"]
    assert winner in measured
    text = (out / "summary.md").read_text()
    assert f"| matrix | {BASE} |" in text and f"| matrix | {BASE}+cb_off |" in text and f"winner: {winner}" in text
    assert (out / "matrix" / "results.json").exists() and (out / "matrix" / "report.txt").exists()
    lines = [json.loads(line) for line in (out / "gpu_results.jsonl").read_text().splitlines()]
    matrix = benchmark_module("gpu_matrix")
    assert [tuple(line) for line in lines] == [matrix.RESULT_FIELDS] * 2
    assert sorted(line["variant"] for line in lines) == [BASE, f"{BASE}+cb_off"]
    for line in lines:
        assert line["step"] == "matrix" and line["model"] == "tiny batch 4 seq 32" and line["card"] == measured[BASE]["device"]
        assert line["ours_seq_per_s"] == pytest.approx(measured[line["variant"]]["seq_per_s"], rel=1e-3)
        assert line["hf_seq_per_s"] is None and line["ratio"] is None and line["share_of_peak"] is None  # no peer, no peak
        assert line["vs_baseline"] == pytest.approx(line["ours_seq_per_s"] / measured[BASE]["seq_per_s"], rel=1e-3)
        assert len(line["date"]) == 10 and line["real_tokens_per_s"] > 0


def test_bundle_leaves_at_most_eight_files_results_apart_from_profiles(tmp_path):
    """A GPU loan returns at most 8 files from $OUT: `gpu_session.sh bundle` packs the session into
    results.tgz (everything but profiles) and the whole folder in 15 MB parts."""
    import tarfile

    out = tmp_path / "out"
    (out / "matrix" / "base" / "profile").mkdir(parents=True)
    (out / "matrix" / "summary.md").write_text("winner: x\n")
    profile = os.urandom(20 * 2**20)  # incompressible: two parts
    (out / "matrix" / "base" / "profile" / "vm.xplane.pb").write_bytes(profile)
    proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", "bundle"], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, OUT=str(out)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["all.tgz.aa", "all.tgz.ab", "results.tgz"] and all((out / f).is_file() for f in files)
    with tarfile.open(out / "results.tgz") as t:
        names = t.getnames()
    assert "./matrix/summary.md" in names and not any(n.endswith(".pb") for n in names)
    whole = b"".join((out / f).read_bytes() for f in ("all.tgz.aa", "all.tgz.ab"))
    (tmp_path / "all.tgz").write_bytes(whole)
    with tarfile.open(tmp_path / "all.tgz") as t:
        assert t.extractfile("./matrix/base/profile/vm.xplane.pb").read() == profile
