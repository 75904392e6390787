"""Two or more ONNX exports of one model, timed call by call against each other: raw text in, as predict.py serves.

Every export gets its own ONNX Runtime session in this one process (threads sleeping between calls, so the
sessions do not take the cores from each other: BERT_TF_ORT_SPINNING=0); each text then goes through every
export back to back, in a fresh random order, and the same for each batch of 32. A slow spell of the machine
hits all of them alike, so the median of the per-text ratios against the first export is steady where
separate runs are not (on a 2-core VM, p50s of separate runs of one file differed by up to 30%). This is how
docs/serving.md's costs of the fused ops and of the float32 first-layer projections were measured.

  python benchmarks/bench_onnx_pair.py export/a_onnx export/b_onnx [--calls=300] [--batches=12]

Texts: the testament task's dev sentences (--dev_file, a TSV with a 'sentence' column).
Prints per export: batch-1 p50 and mean (ms), the median ratio of its per-text times to the first's,
batch-32 texts/s and the median ratio of its per-batch times; --json writes the same numbers.
"""

import argparse
import csv
import json
import os
import random
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def read_sentences(path):
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or "sentence" not in rows[0]:
        sys.exit(f"bench_onnx_pair.py: error: {path}: expected a TSV with a 'sentence' column")
    return [r["sentence"] for r in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export_dirs", nargs="+", help="ONNX exports (export_savedmodel.py --export_format=onnx)")
    parser.add_argument("--calls", type=int, default=300, help="batch-1 calls per export")
    parser.add_argument("--batches", type=int, default=12, help="batch-32 calls per export")
    parser.add_argument("--dev_file", default=os.path.join(REPO, "bert_tf", "resources", "testament", "dev.tsv"))
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if len(args.export_dirs) < 2 or min(args.calls, args.batches) < 1:
        parser.error("give two or more export dirs, and --calls and --batches >= 1")
    os.environ["BERT_TF_ORT_SPINNING"] = "0"
    import numpy as np

    from bert_tf.serving.onnx_predictor import OnnxServe

    serves = []
    for folder in args.export_dirs:
        meta_path = os.path.join(folder, "assets", "bert_tf_export.json")
        if not os.path.exists(os.path.join(folder, "model.onnx")) or not os.path.exists(meta_path):
            sys.exit(f"bench_onnx_pair.py: error: {folder}: not an ONNX export (model.onnx and "
                     "assets/bert_tf_export.json)")
        with open(meta_path, encoding="utf-8") as f:
            serves.append(OnnxServe(folder, json.load(f), intra_op_threads=2))
    texts = read_sentences(args.dev_file)
    rng = random.Random(0)
    n = len(serves)
    for serve in serves:  # warm-up: the first calls allocate
        for text in texts[:10]:
            serve(text_a=[text], text_b=[""])
    single, batched = np.zeros((n, args.calls)), np.zeros((n, args.batches))
    for i in range(args.calls):
        text = texts[i % len(texts)]
        for k in rng.sample(range(n), n):
            start = time.perf_counter()
            serves[k](text_a=[text], text_b=[""])
            single[k, i] = time.perf_counter() - start
    for i in range(args.batches):
        first = (i * 32) % max(1, len(texts) - 32)
        batch = texts[first:first + 32]
        for k in rng.sample(range(n), n):
            start = time.perf_counter()
            serves[k](text_a=batch, text_b=[""] * len(batch))
            batched[k, i] = time.perf_counter() - start
    results = []
    for k, folder in enumerate(args.export_dirs):
        results.append(dict(export_dir=folder, b1_p50_ms=1e3 * float(np.median(single[k])),
                            b1_mean_ms=1e3 * float(np.mean(single[k])),
                            b1_time_vs_first=float(np.median(single[k] / single[0])),
                            b32_texts_per_s=float(32 * args.batches / batched[k].sum()),
                            b32_time_vs_first=float(np.median(batched[k] / batched[0]))))
        r = results[-1]
        print(f"{folder}: batch 1 p50 {r['b1_p50_ms']:.2f} ms (mean {r['b1_mean_ms']:.2f}), time {r['b1_time_vs_first']:.3f}x "
              f"the first's; batch 32 {r['b32_texts_per_s']:.0f} texts/s, time {r['b32_time_vs_first']:.3f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(dict(calls=args.calls, batches=args.batches, results=results), f, indent=1)


if __name__ == "__main__":
    main()
