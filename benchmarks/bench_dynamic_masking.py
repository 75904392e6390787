"""Static masks (dupe_factor copies written by create_pretraining_data.py) against dynamic ones (one copy
without masks, masks drawn in the input pipeline), side by side in one run.

    python benchmarks/bench_dynamic_masking.py --parts=data,pipeline            # the bundled sample corpus
    python benchmarks/bench_dynamic_masking.py --parts=data --corpus=big.txt    # any corpus (lines format)
    python benchmarks/bench_dynamic_masking.py --parts=quality --seeds=1,2,3 --objectives=mlm_nsp,mlm

Data: the corpus cut at a blank line into train (first 90% of its lines) and held-out eval text
(bench_pretraining_accuracy.split_corpus), a 4,000-piece vocab of the train part, then records of
the train part: static with --dupe_factor (and with whole-word masks), dynamic (one copy); eval records
static, dupe factor 1. Every tool run is a subprocess.

Parts:
  data      preprocessing wall time (best of --rounds) and bytes of each kind of train records.
  pipeline  the input pipeline alone, records -> masked batches (pipelines.pretraining_dataset, training
            mode: interleave, shuffle, batch, parse, and for dynamic records draw_masks), sequences/s per
            arm, arms alternating for --rounds rounds, median reported.
  quality   run_pretraining.py (tiny, equal steps) per objective, masking arm and seed; held-out masked-LM
            accuracy on the same static eval records (bench_pretraining_accuracy.run_one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pretraining import cpu_name  # noqa: E402
from bench_pretraining_accuracy import _check, bert_config, mean_sd, run_one, split_corpus  # noqa: E402

# name -> (create_pretraining_data.py flags, whole-word masks)
ARMS = {
    "static": (["--masking=static"], False),
    "static_wwm": (["--masking=static", "--do_whole_word_mask"], True),
    "dynamic": (["--masking=dynamic"], False),
}


def make_data(args, env) -> dict:
    """vocab, eval records and each arm's train records under work_dir, with the tool's wall seconds."""
    os.makedirs(args.work_dir, exist_ok=True)
    with open(args.corpus, encoding="utf-8") as f:
        train_text, eval_text = split_corpus(f.read())
    texts = {}
    for part, text in (("train", train_text), ("eval", eval_text)):
        texts[part] = os.path.join(args.work_dir, f"{part}.txt")
        with open(texts[part], "w", encoding="utf-8") as f:
            f.write(text)
    data = dict(vocab=os.path.join(args.work_dir, "vocab.txt"), seconds={}, bytes={}, records={})
    py = sys.executable
    _check([py, "create_vocab.py", f"--input_file={texts['train']}", f"--vocab_file={data['vocab']}",
            "--vocab_size=4000"], env)

    def records(name, text, flags):
        path = os.path.join(args.work_dir, f"{name}.tfrecord")
        command = [py, "create_pretraining_data.py", f"--input_file={text}", f"--output_file={path}",
                   f"--vocab_file={data['vocab']}", "--do_lower_case=True", f"--max_seq_length={args.seq}",
                   f"--max_predictions_per_seq={args.preds}", "--random_seed=12345", *flags]
        times = []
        for _ in range(args.rounds if "data" in args.parts else 1):
            start = time.time()
            _check(command, env)
            times.append(time.time() - start)
        data[name], data["seconds"][name], data["bytes"][name] = path, min(times), os.path.getsize(path)
        import tensorflow as tf

        data["records"][name] = sum(1 for _ in tf.data.TFRecordDataset(path))

    for name, (flags, _) in ARMS.items():
        dupe = [] if name == "dynamic" else [f"--dupe_factor={args.dupe_factor}"]
        records(name, texts["train"], flags + dupe)
    records("eval", texts["eval"], ["--dupe_factor=1"])
    return data


def pipeline_rates(args, data) -> dict:
    """Sequences/s of records -> masked batches per arm (dynamic also with whole words), median of rounds."""
    import tensorflow as tf

    from bert_tf.data import masking, pipelines
    from bert_tf.tokenization import load_vocab

    vocab = load_vocab(data["vocab"])
    arms = {"static": ("static", None), "dynamic": ("dynamic", masking.options_from_vocab(vocab, args.preds)),
            "dynamic_wwm": ("dynamic", masking.options_from_vocab(vocab, args.preds, do_whole_word_mask=True))}
    iterators = {}
    for name, (records, options) in arms.items():
        ds = pipelines.pretraining_dataset([data[records]], args.seq, args.preds, args.batch, is_training=True,
                                           seed=1, dynamic_masking=options)
        iterators[name] = iter(ds)
        for _ in range(20):  # warm-up: tracing, buffers filled
            next(iterators[name])
    rates = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, iterator in iterators.items():
            start = time.perf_counter()
            for _ in range(args.batches):
                tf.nest.map_structure(lambda t: t.numpy(), next(iterator))
            rates[name].append(args.batches * args.batch / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in rates.items()} | {"rounds": rates}


def quality(args, data, env) -> dict:
    """{objective/arm: [eval results per seed]}: equal steps, the same held-out static eval records."""
    config_file = bert_config(args, data["vocab"], args.work_dir)
    runs = {}
    for seed in [int(s) for s in args.seeds.split(",")]:  # seeds outermost: a cut run keeps whole seeds
        for objective in args.objectives.split(","):
            for arm in args.quality_arms.split(","):
                records, wwm = ("dynamic", arm == "dynamic_wwm") if arm.startswith("dynamic") else (arm, False)
                extra = [f"--objective={objective}"] + (["--do_whole_word_mask"] if wwm else [])
                result = run_one(args, "cpu-fp32-graph", seed, dict(data, train=data[records]), config_file, env,
                                 extra=extra, tag=f"-{objective}-{arm}")
                runs.setdefault(f"{objective}/{arm}", []).append(dict(result, seed=seed))
                print(f"{objective}/{arm} seed {seed}: {result}", file=sys.stderr, flush=True)
    return runs


def report(args, data, rates, runs) -> list:
    lines = [f"CPU: {cpu_name()}; corpus {os.path.basename(args.corpus)}, seq {args.seq}, {args.preds} predictions"]
    if "data" in args.parts:
        lines.append(f"preprocessing (best of {args.rounds}), train part; static dupe_factor {args.dupe_factor}:")
        for name in ARMS:
            lines.append(f"  {name:11s} {data['records'][name]:8d} records {data['bytes'][name] / 1e6:8.2f} MB "
                         f"{data['seconds'][name]:6.1f} s  (bytes x{data['bytes'][name] / data['bytes']['dynamic']:.2f}"
                         f", time x{data['seconds'][name] / data['seconds']['dynamic']:.2f} of dynamic)")
    if rates:
        lines.append(f"input pipeline, records -> batches of {args.batch} (median of {args.rounds} rounds of "
                     f"{args.batches} batches):")
        for name in ("static", "dynamic", "dynamic_wwm"):
            lines.append(f"  {name:11s} {rates[name]:10.0f} sequences/s  (x{rates[name] / rates['static']:.2f} of "
                         "static)")
    for key, results in (runs or {}).items():
        ok = [r for r in results if "error" not in r]
        if not ok:
            lines.append(f"  {key}: failed: {results[0].get('error')}")
            continue

        def cell(metric, ok=ok):
            return mean_sd([r[metric] for r in ok])

        lines.append(f"  {key:22s} held-out MLM acc {cell('masked_lm_accuracy')}, loss {cell('masked_lm_loss')}; "
                     "acc per seed " + " ".join(f"{r['masked_lm_accuracy']:.4f}" for r in ok))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="data,pipeline", help="comma-separated: data, pipeline, quality")
    parser.add_argument("--corpus", default=None, help="default: the package's sample corpus")
    parser.add_argument("--work_dir", default="/tmp/bench_dynamic_masking")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--preds", type=int, default=10)
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="pipeline and training batch")
    parser.add_argument("--batches", type=int, default=200, help="pipeline: batches timed per round")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--objectives", default="mlm_nsp,mlm")
    parser.add_argument("--quality_arms", default="static,dynamic,static_wwm,dynamic_wwm")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--warmup_steps", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=4e-4)
    parser.add_argument("--eval_batch", type=int, default=64)
    parser.add_argument("--eval_steps", type=int, default=20)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    if args.corpus is None:
        from bert_tf.resources import SAMPLE_CORPUS

        args.corpus = SAMPLE_CORPUS
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    data = make_data(args, env)
    rates = pipeline_rates(args, data) if "pipeline" in args.parts else None
    runs = quality(args, data, env) if "quality" in args.parts else None
    lines = report(args, data, rates, runs)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(settings=vars(args), data=data, rates=rates, runs=runs, report=lines), f, indent=1)


if __name__ == "__main__":
    main()
