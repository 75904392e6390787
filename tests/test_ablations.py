"""experiments/ablations.py: the generated tasks are right, and a cut-down --quick run writes the
table, CSV and plot from a left-to-right model that stays causal when fine-tuned."""

import csv
import json
import os
import random
import subprocess
import sys

import pytest

from bert_tf.resources import SAMPLE_CORPUS
from bert_tf.tasks.corpus_tasks import next_verse_pairs, read_chapters, split_chapters, squad_json, word_questions

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def chapters():
    return read_chapters(SAMPLE_CORPUS)


def test_chapters_and_split(chapters):
    assert len(chapters) == 60  # the sample: the first 60 chapters
    assert chapters[0][0].startswith("In the beginning God created")
    train, dev = split_chapters(chapters)
    assert len(dev) == 12 and len(train) == 48
    assert not {v for c in train for v in c} & {v for c in dev for v in c} - {""}  # (no verse in both, up to repeats)


def test_next_verse_pairs(chapters):
    rows = next_verse_pairs(chapters, 200, random.Random(0))
    assert len(rows) == 200 and sum(r[2] == "next" for r in rows) == 100
    following = {(c[i], c[i + 1]) for c in chapters for i in range(len(c) - 1)}
    for a, b, label in rows:
        if label == "next":
            assert (a, b) in following
        else:
            assert not any(a in c and b in c for c in chapters)  # b is from another chapter
    assert rows == next_verse_pairs(chapters, 200, random.Random(0))  # seeded


def test_word_questions_point_at_their_unique_answer(chapters):
    questions = word_questions(chapters, 100, random.Random(1))
    assert len(questions) == 100
    assert [q[5] for q in questions[:4]] == ["after", "before", "after", "before"]
    for _qid, context, question, answer, start, kind in questions:
        assert context[start:start + len(answer)] == answer and len(answer) >= 3
        cue = question.split('"')[1]
        words = [w.lower() for w in __import__("re").findall(r"[A-Za-z]+", context)]
        pairs = [" ".join(words[j:j + 2]) for j in range(len(words) - 1)]
        assert pairs.count(cue) == 1
        k = pairs.index(cue)
        assert words[k + 2 if kind == "after" else k - 1] == answer.lower()
    data = squad_json(questions[:2])
    qa = data["data"][0]["paragraphs"][0]["qas"][0]
    assert data["version"] == "1.1" and qa["answers"][0]["text"] == questions[0][3]


def test_quick_run_writes_table_csv_and_plot(tmp_path):
    out = tmp_path / "ablations"
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "experiments", "ablations.py"), "--quick", f"--output_dir={out}",
         "--objectives=ltr", "--tasks=wordspan", "--num_checkpoints=1", "--pretrain_steps=4",
         f"--corpus={SAMPLE_CORPUS}"],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "results.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    keys = {(r["objective"], r["pretrain_step"], r["metric"]) for r in rows}
    assert {("ltr", "4", "exact_match"), ("none", "0", "exact_match"), ("ltr", "4", "exact_match_before")} <= keys
    assert all(0.0 <= float(r["value"]) <= 100.0 for r in rows)
    table = (out / "results.md").read_text()
    assert "| ltr | 4 | lm_accuracy" in table and "| none | 0 |" in table
    assert (out / "dev_vs_pretraining_steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The objective is recorded, and fine-tuning from the LTR checkpoint stayed causal.
    info = json.loads((out / "pretrained" / "ltr" / "bert_tf_info.json").read_text())
    assert info["objective"] == "ltr" and info["causal_attention"] is True
    finetuned = json.loads((out / "finetuned" / "ltr_4_wordspan" / "bert_tf_info.json").read_text())
    assert finetuned["causal_attention"] is True
    assert "causal_attention" not in json.loads((out / "finetuned" / "none_wordspan" / "bert_tf_info.json").read_text())
