"""benchmarks/bench_onnx_pair.py: ONNX exports timed call by call against the first, through the script."""

import json
import subprocess
import sys

import pytest
from conftest import REPO, tiny_task_model_dir

pytest.importorskip("onnxruntime")


def test_pairs_exports_call_by_call_and_refuses_a_folder_that_is_not_one(tmp_path):
    from bert_tf.export import export_model_dir

    tiny_task_model_dir(tmp_path / "dir", {"task_type": "classification", "label_list": ["no", "yes"]}, seq=24,
                        hidden=16, layers=2, weight_sd=0.5, seed=3)
    fused, plain = tmp_path / "fused", tmp_path / "plain"
    export_model_dir(str(tmp_path / "dir"), str(fused), export_format="onnx")
    export_model_dir(str(tmp_path / "dir"), str(plain), export_format="onnx", onnx_fusions=False)
    out = tmp_path / "pair.json"
    result = subprocess.run([sys.executable, "benchmarks/bench_onnx_pair.py", str(plain), str(fused), str(plain),
                             "--calls=6", "--batches=2", f"--json={out}"], capture_output=True, text=True, cwd=REPO,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert (saved["calls"], saved["batches"]) == (6, 2)
    first, second, third = saved["results"]
    assert first["b1_time_vs_first"] == first["b32_time_vs_first"] == 1.0
    for r in saved["results"]:
        assert r["b1_p50_ms"] > 0 and r["b32_texts_per_s"] > 0 and r["b1_time_vs_first"] > 0
    assert [r["export_dir"] for r in saved["results"]] == [str(plain), str(fused), str(plain)]
    assert result.stdout.count("texts/s") == 3
    bad = subprocess.run([sys.executable, "benchmarks/bench_onnx_pair.py", str(plain), str(tmp_path / "dir")],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1] == (
        f"bench_onnx_pair.py: error: {tmp_path / 'dir'}: not an ONNX export (model.onnx and assets/bert_tf_export.json)")
