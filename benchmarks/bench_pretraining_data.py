"""create_pretraining_data: ours vs tf-models-official's port of the original, one after the other.

    python benchmarks/bench_pretraining_data.py [--corpus ../shared/corpora/kjv_pretraining.txt]
        [--vocab ../shared/fixtures/vocab/bert-base-uncased-vocab.txt] [--dupe_factor 5] [--skip_port]
    python benchmarks/bench_pretraining_data.py --beam [--num_workers 2] [--files 8]   # local tool vs Beam

Same corpus and flags for both (max_seq_length 128, max_predictions_per_seq 20,
dupe_factor 5, seed 12345, uncased). Each tool runs as a subprocess; its
process tree (workers included) is polled every 0.2 s for resident memory:
peak RSS summed over the tree (counts pages shared by forked workers once per
process, so it overstates ours) and peak PSS (shared pages split between the
processes that share them). Instances/s = instances written / wall time of the
whole command (start-up, reading, tokenizing, writing). Then ours runs again on
the corpus concatenated 10 times, to show that its peak memory does not grow.

--beam: --beam_copies copies of the corpus split into --files files at document
boundaries (as Wikipedia comes in shards); the local tool with --num_workers N, then the Beam pipeline
(--runner=DirectRunner: the FnApiRunner in N worker processes) on the same files,
in the same run; both write the same records. Reports instances/s of each, the
ratio, the peak PSS of the largest single Beam process (a worker), and the
vCPUs a Beam run needs for Wikipedia + books (~20 GB of text) in one hour at
the measured text bytes per second per worker process.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("BERT_TF_SHARED", REPO.parent / "shared"))


def _tree_memory(proc: psutil.Process, per_process=None):
    """(RSS, PSS) summed over proc's tree; per_process (pid -> peak PSS) is updated when given."""
    rss = pss = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0
    for p in procs:
        try:
            info = p.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
            if per_process is not None:
                per_process[p.pid] = max(per_process.get(p.pid, 0), getattr(info, "pss", info.rss))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return rss, pss


def run_measured(cmd, env=None, per_process=None):
    """Runs cmd; returns (seconds, peak tree RSS bytes, peak tree PSS bytes, stderr tail).

    per_process: a dict that receives each process's peak PSS (bytes) by pid (index 'launcher' for cmd's own)."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        ps = psutil.Process(proc.pid)
        peak_rss = peak_pss = 0
        while proc.poll() is None:
            rss, pss = _tree_memory(ps, per_process)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            time.sleep(0.2)
        if per_process is not None and proc.pid in per_process:
            per_process["launcher"] = per_process.pop(proc.pid)
        seconds = time.monotonic() - start
        err.seek(0)
        tail = err.read().decode(errors="replace")[-2000:]
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({proc.returncode}):\n{tail}")
    return seconds, peak_rss, peak_pss, tail


def count_records(paths):
    sys.path.insert(0, str(REPO))
    from bert_tf.data import schema

    return sum(1 for p in paths for _ in schema.read_records(p))


def record_statistics(path, vocab_file, max_seq_length=128, max_predictions_per_seq=20):
    """The statistics the original's procedure fixes, measured on an output file (to compare the tools)."""
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, str(REPO))
    from bert_tf.data import schema

    with open(vocab_file, encoding="utf-8") as f:
        mask_id = [line.strip() for line in f].index("[MASK]")
    cols = {k: [] for k in ("input_ids", "input_mask", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights",
                            "next_sentence_labels")}
    ds = tf.data.TFRecordDataset(path).batch(4096).map(
        lambda x: schema.parse_pretraining_example(x, max_seq_length, max_predictions_per_seq))
    for batch in ds:
        for k in cols:
            cols[k].append(batch[k].numpy())
    c = {k: np.concatenate(v) for k, v in cols.items()}
    n = c["input_mask"].sum(1)
    valid = c["masked_lm_weights"] > 0
    rows = np.nonzero(valid)[0]
    now = c["input_ids"][rows, c["masked_lm_positions"][valid]]
    return {"tokens_per_instance": float(n.mean()), "full_length_fraction": float((n == max_seq_length).mean()),
            "predicted_fraction": float(valid.sum() / n.sum()), "mask_fraction": float((now == mask_id).mean()),
            "kept_fraction": float((now == c["masked_lm_ids"][valid]).mean()),
            "random_next_fraction": float(c["next_sentence_labels"].mean())}


WIKI_BOOKS_BYTES = 20e9  # Wikipedia + BooksCorpus as text (~3.3B words)


def split_corpus(corpus: str, folder: str, num_files: int, copies: int = 1):
    """`copies` times the corpus in num_files files of about equal size, cut at blank lines (document boundaries)."""
    with open(corpus, encoding="utf-8") as f:
        docs = f.read().split("\n\n") * copies
    per_file = -(-len(docs) // num_files)
    paths = []
    for i in range(num_files):
        part = docs[i * per_file:(i + 1) * per_file]
        if part:
            paths.append(os.path.join(folder, f"part-{i:03d}.txt"))
            with open(paths[-1], "w", encoding="utf-8") as f:
                f.write("\n\n".join(part) + "\n")
    return paths


def beam_comparison(args, common, env):
    """The local tool and the Beam pipeline on the same files and cores, one after the other."""
    import glob

    workers = args.num_workers or os.cpu_count()
    results = {"cores": os.cpu_count(), "workers": workers, "corpus": args.corpus, "copies": args.beam_copies,
               "dupe_factor": args.dupe_factor, "files": args.files}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = split_corpus(args.corpus, tmp, args.files, args.beam_copies)
        results["corpus_bytes"] = sum(os.path.getsize(p) for p in inputs)
        pattern = os.path.join(tmp, "part-*.txt")
        base = [sys.executable, str(REPO / "create_pretraining_data.py"), f"--input_file={pattern}",
                f"--num_workers={workers}", f"--num_output_shards={workers}", *common]
        for name, extra in (("local", []), ("beam", ["--runner=DirectRunner"])):
            out = os.path.join(tmp, f"{name}.tfrecord")
            per_process = {}
            sec, rss, pss, _ = run_measured(base + [f"--output_file={out}"] + extra, env, per_process)
            files = sorted(glob.glob(out + "-*"))
            n = count_records(files)
            for f in files:
                os.remove(f)
            launcher = per_process.pop("launcher", 0)
            results[name] = {"seconds": sec, "instances": n, "instances_per_s": n / sec,
                             "peak_rss_mb": rss / 2**20, "peak_pss_mb": pss / 2**20,
                             "launcher_peak_pss_mb": launcher / 2**20,
                             "largest_other_process_peak_pss_mb": max(per_process.values(), default=0) / 2**20}
            print(f"{name}:", json.dumps(results[name]), flush=True)
        del inputs
    local, beam = results["local"], results["beam"]
    results["beam_over_local"] = beam["instances_per_s"] / local["instances_per_s"]
    bytes_per_s_per_worker = results["corpus_bytes"] / beam["seconds"] / workers
    results["beam_text_bytes_per_s_per_worker"] = bytes_per_s_per_worker
    results["wiki_books_vcpus_for_1h"] = WIKI_BOOKS_BYTES / (bytes_per_s_per_worker * 3600)
    print()
    print(f"{'path':<8}{'instances':>10}{'seconds':>9}{'inst/s':>9}{'tree PSS MB':>13}{'largest worker PSS MB':>23}")
    for key in ("local", "beam"):
        r = results[key]
        print(f"{key:<8}{r['instances']:>10}{r['seconds']:>9.1f}{r['instances_per_s']:>9.0f}{r['peak_pss_mb']:>13.0f}"
              f"{r['largest_other_process_peak_pss_mb']:>23.0f}")
    print(f"Beam / local: {results['beam_over_local']:.2f}x; Beam text rate {bytes_per_s_per_worker / 1e3:.0f} KB/s "
          f"per worker process -> Wikipedia + books (20 GB) in 1 hour: ~{results['wiki_books_vcpus_for_1h']:.0f} "
          f"worker vCPUs at dupe_factor {args.dupe_factor}")
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(SHARED / "corpora" / "kjv_pretraining.txt"))
    parser.add_argument("--vocab", default=str(SHARED / "fixtures" / "vocab" / "bert-base-uncased-vocab.txt"))
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--num_workers", type=int, default=0, help="ours; 0 = all cores")
    parser.add_argument("--scale", type=int, default=10, help="copies of the corpus for the memory-growth run")
    parser.add_argument("--skip_port", action="store_true")
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--beam", action="store_true", help="only the local tool vs the Beam pipeline")
    parser.add_argument("--files", type=int, default=8, help="--beam: input files the corpus is split into")
    parser.add_argument("--beam_copies", type=int, default=6, help="--beam: copies of the corpus (so that the "
                        "runner's start-up, ~5-10 s, does not dominate)")
    args = parser.parse_args()

    common = [f"--vocab_file={args.vocab}", "--do_lower_case=True", "--max_seq_length=128",
              "--max_predictions_per_seq=20", "--masked_lm_prob=0.15", "--short_seq_prob=0.1",
              "--random_seed=12345", f"--dupe_factor={args.dupe_factor}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    if args.beam:
        results = beam_comparison(args, common, env)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        return
    results = {"cores": os.cpu_count(), "corpus": args.corpus, "corpus_bytes": os.path.getsize(args.corpus),
               "dupe_factor": args.dupe_factor}
    stats = {}
    with tempfile.TemporaryDirectory() as tmp:
        def ours(corpus, name):
            out = os.path.join(tmp, f"{name}.tfrecord")
            cmd = [sys.executable, str(REPO / "create_pretraining_data.py"), f"--input_file={corpus}",
                   f"--output_file={out}", f"--num_workers={args.num_workers}", *common]
            sec, rss, pss, _ = run_measured(cmd, env)
            n = count_records([out])
            if name == "ours":
                stats["ours"] = record_statistics(out, args.vocab)
            os.remove(out)
            return {"seconds": sec, "instances": n, "instances_per_s": n / sec, "peak_rss_mb": rss / 2**20,
                    "peak_pss_mb": pss / 2**20}

        results["ours"] = ours(args.corpus, "ours")
        print("ours:", json.dumps(results["ours"]), flush=True)

        big = os.path.join(tmp, "big.txt")
        with open(args.corpus, "rb") as src:
            data = src.read()
        with open(big, "wb") as f:
            for _ in range(args.scale):
                f.write(data)
                f.write(b"\n\n")
        results[f"ours_{args.scale}x"] = ours(big, "big")
        print(f"ours {args.scale}x corpus:", json.dumps(results[f"ours_{args.scale}x"]), flush=True)
        os.remove(big)

        if not args.skip_port:
            out = os.path.join(tmp, "port.tfrecord")
            cmd = [sys.executable, "-m", "official.nlp.data.create_pretraining_data", f"--input_file={args.corpus}",
                   f"--output_file={out}", *common]
            sec, rss, pss, _ = run_measured(cmd, env)
            n = count_records([out])
            stats["port"] = record_statistics(out, args.vocab)
            results["port"] = {"seconds": sec, "instances": n, "instances_per_s": n / sec,
                               "peak_rss_mb": rss / 2**20, "peak_pss_mb": pss / 2**20}
            print("tf-models port:", json.dumps(results["port"]), flush=True)
            o, p = results["ours"], results["port"]
            results["speedup"] = o["instances_per_s"] / p["instances_per_s"]
            results["memory_ratio_rss"] = p["peak_rss_mb"] / o["peak_rss_mb"]
            results["memory_ratio_pss"] = p["peak_pss_mb"] / o["peak_pss_mb"]
        big_o = results[f"ours_{args.scale}x"]
        results["memory_growth_10x_pss"] = big_o["peak_pss_mb"] / results["ours"]["peak_pss_mb"]

    print()
    print(f"{'tool':<22}{'instances':>10}{'seconds':>9}{'inst/s':>9}{'peak RSS MB':>13}{'peak PSS MB':>13}")
    for key in ("ours", f"ours_{args.scale}x", "port"):
        if key in results:
            r = results[key]
            print(f"{key:<22}{r['instances']:>10}{r['seconds']:>9.1f}{r['instances_per_s']:>9.0f}"
                  f"{r['peak_rss_mb']:>13.0f}{r['peak_pss_mb']:>13.0f}")
    if "speedup" in results:
        print(f"throughput ours/port: {results['speedup']:.1f}x; peak memory port/ours: "
              f"{results['memory_ratio_rss']:.1f}x (RSS), {results['memory_ratio_pss']:.1f}x (PSS)")
    print(f"peak PSS on the {args.scale}x corpus / on the corpus: {results['memory_growth_10x_pss']:.2f}")
    results["statistics"] = stats
    if stats:
        print()
        print(f"{'statistic':<24}" + "".join(f"{k:>10}" for k in stats))
        for key in next(iter(stats.values())):
            print(f"{key:<24}" + "".join(f"{v[key]:>10.4f}" for v in stats.values()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
