"""Does training on a GPU learn what training on the CPU learns? One short pretraining recipe, run per
device / precision / XLA variant and per seed, reporting held-out masked-LM and next-sentence accuracy.

Every run is `run_pretraining.py --do_train --do_eval` in a process of its own (what a user runs), with
the same records, recipe and seed for every variant; only the device (CUDA_VISIBLE_DEVICES), the
precision (--mixed_precision) and XLA (--jit_compile) change. The spread over seeds on one variant is
the run-to-run noise (initialisation, dropout and shuffling all follow --seed); a variant agrees with
the reference (the first one listed) when its mean lies within the noise of the reference's.

Data (default): the package's sample corpus (KJV, 60 chapters), cut at a blank line into train (first
90% of its lines) and held-out eval text, a 4,000-piece WordPiece vocab of the train part, and
create_pretraining_data.py records of both (seq 64, 10 predictions, dupe factor 5 / 1), built once
under --work_dir. Or --input_file / --eval_input_file / --vocab_file: records of your own.

Variants, `{device}-{precision}-{mode}`: device cpu or gpu, precision fp32 / bf16 / fp16, mode graph or
xla. Default: cpu-fp32-graph and cpu-bf16-graph, plus gpu-bf16-xla and gpu-fp16-xla when nvidia-smi lists
a GPU (the CPU variants then run on the GPU machine's CPU).

  python benchmarks/bench_pretraining_accuracy.py --seeds=1,2,3                 # CPU noise, tiny, 1500 steps
  python benchmarks/bench_pretraining_accuracy.py --variants=cpu-fp32-graph,gpu-bf16-xla,gpu-fp16-xla
  python benchmarks/bench_pretraining_accuracy.py --size=small --learning_rate=4e-4 --warmup_steps=2 --batch=256

Seeds change the weights, not the programs: the runs share one XLA compilation cache under --work_dir,
so only a variant's first run compiles. Results: a table on stdout, and accuracy_results.json +
accuracy_report.txt under --out_dir (default: $OUT when set, beside bench_pretraining.py's files).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pretraining import cpu_name, gpu_name  # noqa: E402 (the device names every figure carries)

PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
METRICS = ("masked_lm_accuracy", "next_sentence_accuracy", "masked_lm_loss", "next_sentence_loss")


def split_corpus(text: str, eval_fraction: float = 0.1):
    """(train, eval) text: the last `eval_fraction` of the lines held out, cut at a blank line (a
    document boundary) at or after that point so no document is in both."""
    lines = text.splitlines(keepends=True)
    cut = int(len(lines) * (1 - eval_fraction))
    while cut < len(lines) and lines[cut].strip():
        cut += 1
    if cut >= len(lines):
        raise ValueError("the corpus has no blank line (document boundary) in its last part to hold out from")
    return "".join(lines[:cut]), "".join(lines[cut + 1:])


def parse_variant(name: str):
    """'gpu-bf16-xla' -> ('gpu', 'bfloat16', True); ValueError for anything else."""
    parts = name.split("-")
    if len(parts) != 3 or parts[0] not in ("cpu", "gpu") or parts[1] not in PRECISIONS or parts[2] not in ("graph", "xla"):
        raise ValueError(f"bad variant {name!r}: expected {{cpu,gpu}}-{{fp32,bf16,fp16}}-{{graph,xla}}")
    return parts[0], PRECISIONS[parts[1]], parts[2] == "xla"


def agreement(reference, other):
    """How `other`'s seeds compare with `reference`'s, per metric: the difference of the means, the
    reference's run-to-run standard deviation over its seeds, and whether the difference is within 2 of
    them (never with a single reference seed: its noise is unknown)."""
    out = {}
    for metric in METRICS:
        a = [r[metric] for r in reference if metric in r]
        b = [r[metric] for r in other if metric in r]
        if not a or not b:
            continue
        sd = statistics.stdev(a) if len(a) > 1 else float("nan")
        diff = statistics.mean(b) - statistics.mean(a)
        out[metric] = dict(diff=diff, reference_sd=sd, within_noise=bool(len(a) > 1 and abs(diff) <= 2 * sd))
    return out


def read_results(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return {k: float(v) for k, v in (line.strip().split(" = ") for line in f if " = " in line)}


def make_data(work_dir: str, seq: int, preds: int, env) -> dict:
    """Vocab and train / held-out eval records of the sample corpus under work_dir (once; reused after)."""
    from bert_tf.resources import SAMPLE_CORPUS

    data = dict(vocab=os.path.join(work_dir, "vocab.txt"), train=os.path.join(work_dir, f"train{seq}.tfrecord"),
                eval=os.path.join(work_dir, f"eval{seq}.tfrecord"))
    if all(os.path.exists(p) for p in data.values()):
        return data
    os.makedirs(work_dir, exist_ok=True)
    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        train_text, eval_text = split_corpus(f.read())
    texts = {}
    for part, text in (("train", train_text), ("eval", eval_text)):
        texts[part] = os.path.join(work_dir, f"{part}.txt")
        with open(texts[part], "w", encoding="utf-8") as f:
            f.write(text)
    py = sys.executable
    _check([py, "create_vocab.py", f"--input_file={texts['train']}", f"--vocab_file={data['vocab']}",
            "--vocab_size=4000"], env)
    for part, dupe in (("train", 5), ("eval", 1)):
        _check([py, "create_pretraining_data.py", f"--input_file={texts[part]}", f"--output_file={data[part]}",
                f"--vocab_file={data['vocab']}", "--do_lower_case=True", f"--max_seq_length={seq}",
                f"--max_predictions_per_seq={preds}", f"--dupe_factor={dupe}", "--random_seed=12345"], env)
    return data


def _check(command, env):
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{os.path.basename(command[1])} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")


def bert_config(args, vocab_file: str, work_dir: str) -> str:
    from bert_tf.configs import BertConfig
    from bert_tf.tokenization import load_vocab

    path = os.path.join(work_dir, f"bert_config_{args.size}.json")
    BertConfig.named(args.size, vocab_size=len(load_vocab(vocab_file)),
                     max_position_embeddings=max(128, args.seq)).to_json_file(path)
    return path


def run_one(args, variant: str, seed: int, data: dict, config_file: str, env, extra=(), tag: str = "") -> dict:
    """One run_pretraining.py run of the recipe (plus `extra` flags; `tag` names its folder): its eval
    results and wall seconds, or {'error': line}."""
    device, precision, xla = parse_variant(variant)
    out = os.path.join(args.work_dir, "runs", f"{variant}{tag}-seed{seed}")
    run_env = dict(env)
    if device == "cpu":
        run_env["CUDA_VISIBLE_DEVICES"] = ""
    command = [
        sys.executable, "run_pretraining.py", f"--bert_config_file={config_file}", f"--input_file={data['train']}",
        f"--eval_input_file={data['eval']}", f"--vocab_file={data['vocab']}", "--do_lower_case=True",
        f"--output_dir={out}", "--overwrite_output_dir", "--do_train", "--do_eval",
        f"--max_seq_length={args.seq}", f"--max_predictions_per_seq={args.preds}",
        f"--train_batch_size={args.batch}", f"--eval_batch_size={args.eval_batch}",
        f"--num_train_steps={args.steps}", f"--num_warmup_steps={args.warmup_steps}",
        f"--learning_rate={args.learning_rate}", f"--iterations_per_loop={min(args.steps, 250)}",
        f"--save_checkpoints_steps={args.steps}", f"--max_eval_steps={args.eval_steps}", f"--seed={seed}",
        f"--mixed_precision={precision}", f"--jit_compile={str(xla).lower()}", f"--xla_cache_dir={os.path.join(args.work_dir, 'xla_cache')}",
        *extra,
    ]
    start = time.time()
    proc = subprocess.run(command, cwd=REPO, env=run_env, capture_output=True, text=True)
    if proc.returncode or not os.path.exists(os.path.join(out, "eval_results.txt")):
        return dict(error=(proc.stderr.strip().splitlines() or ["failed"])[-1][:300])
    return dict(read_results(os.path.join(out, "eval_results.txt")), seconds=time.time() - start)


def mean_sd(values) -> str:
    """'mean ± sd' of the seeds' values (sd nan for one seed)."""
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.4f} ± {sd:.4f}"


def report(args, variants, results, devices) -> list:
    """The table (mean, sd and each seed's value per variant) and each variant's agreement with the first."""
    lines = [f"BERT-{args.size}, seq {args.seq}, batch {args.batch}, {args.steps} steps (warmup {args.warmup_steps}), "
             f"lr {args.learning_rate}, seeds {args.seeds}; eval: {args.eval_steps} batches of {args.eval_batch} "
             f"held-out records",
             f"{'variant':16s} {'MLM acc':>16s} {'NSP acc':>16s} {'MLM loss':>9s} {'s/run':>6s}  per seed MLM acc  device"]
    for v in variants:
        ok = [r for r in results[v] if "error" not in r]
        if not ok:
            lines.append(f"{v:16s} failed: {results[v][0]['error'] if results[v] else 'no runs'}")
            continue

        def cell(metric, ok=ok):
            return mean_sd([r[metric] for r in ok])

        lines.append(f"{v:16s} {cell('masked_lm_accuracy'):>16s} {cell('next_sentence_accuracy'):>16s} "
                     f"{statistics.mean(r['masked_lm_loss'] for r in ok):9.4f} "
                     f"{statistics.mean(r['seconds'] for r in ok):6.0f}  "
                     f"{' '.join(format(r['masked_lm_accuracy'], '.4f') for r in ok)}  {devices[v.split('-')[0]]}")
    reference = variants[0]
    for v in variants[1:]:
        ok_ref = [r for r in results[reference] if "error" not in r]
        ok = [r for r in results[v] if "error" not in r]
        for metric, a in agreement(ok_ref, ok).items():
            if metric.endswith("accuracy"):
                lines.append(f"{v} vs {reference} {metric}: {a['diff']:+.4f} (reference run-to-run sd "
                             f"{a['reference_sd']:.4f}): {'within' if a['within_noise'] else 'NOT within'} 2 sd")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=None, help="comma-separated; default: see the docstring")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--size", default="tiny", help="BertConfig.named size")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--preds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--warmup_steps", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=4e-4)
    parser.add_argument("--eval_batch", type=int, default=64)
    parser.add_argument("--eval_steps", type=int, default=20)
    parser.add_argument("--work_dir", default="/tmp/bench_pretraining_accuracy",
                        help="data and runs (the sample corpus' records are built here once)")
    parser.add_argument("--input_file", default=None, help="your own train records (with --eval_input_file, --vocab_file)")
    parser.add_argument("--eval_input_file", default=None)
    parser.add_argument("--vocab_file", default=None)
    parser.add_argument("--out_dir", default=os.environ.get("OUT") or None,
                        help="write results.json and report.txt here (default: $OUT when set)")
    args = parser.parse_args()
    gpu = gpu_name()
    variants = (args.variants.split(",") if args.variants else
                ["cpu-fp32-graph", "cpu-bf16-graph"] + (["gpu-bf16-xla", "gpu-fp16-xla"] if gpu else []))
    try:
        for v in variants:
            parse_variant(v)
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as e:
        parser.error(str(e).splitlines()[0])
    if any(v.startswith("gpu") for v in variants) and not gpu:
        parser.error("a gpu-* variant needs a GPU: nvidia-smi lists none")
    if bool(args.input_file) != bool(args.eval_input_file and args.vocab_file):
        parser.error("--input_file needs --eval_input_file and --vocab_file (and they need it)")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    sys.path.insert(0, REPO)
    data = (dict(train=args.input_file, eval=args.eval_input_file, vocab=args.vocab_file) if args.input_file
            else make_data(args.work_dir, args.seq, args.preds, env))
    config_file = bert_config(args, data["vocab"], args.work_dir)
    devices = dict(cpu=cpu_name(), gpu=gpu or "no GPU")
    results = {v: [] for v in variants}
    for seed in seeds:  # seeds outermost: every variant has its first seeds if the run is cut short
        for v in variants:
            r = dict(run_one(args, v, seed, data, config_file, env), seed=seed)
            results[v].append(r)
            print(f"{v} seed {seed}: " + (r["error"] if "error" in r else
                  f"MLM acc {r['masked_lm_accuracy']:.4f} NSP acc {r['next_sentence_accuracy']:.4f} "
                  f"{r['seconds']:.0f}s"), file=sys.stderr, flush=True)
    lines = report(args, variants, results, devices)
    print("\n".join(lines))
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "accuracy_results.json"), "w") as f:
            json.dump(dict(settings=vars(args), devices=devices, results=results), f, indent=1, sort_keys=True)
        with open(os.path.join(args.out_dir, "accuracy_report.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
