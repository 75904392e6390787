"""Packed against padded pretraining under XLA: real (non-padding) tokens per second, in one run.

Times the Trainer's compiled gradient step of the same BERT pretrainer (forward + backward with
dropout as in training, `jit_compile=True`; the optimizer update, the same for every variant, is
left out) on the same pretraining records read two ways:
  padded   one instance per row (pipelines.pretraining_dataset), as TPU/GPU BERT runs do today
  packed   several instances per row (packing.packed_pretraining_dataset, run_pretraining --pack_sequences)
and, for reference, the CPU default: graph mode with skip_padding (no XLA, unpacked).
Each variant runs in its own process, one after another, round after round; the report gives
real tokens/s (tokens of instances, not of padding), the packing efficiency of the timed batches,
and the issue's check: packed rate / padded rate >= 0.9 x (packed efficiency / padded efficiency),
i.e. the block-diagonal mask, gathers and bookkeeping of packing cost at most 10% of what removing
the padding gains.

  python create_pretraining_data.py --input_file=kjv.txt --output_file=/tmp/kjv128.tfrecord \
      --vocab_file=vocab.txt --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=1
  python benchmarks/bench_packing.py --input_file=/tmp/kjv128.tfrecord --max_seq_length=128 \
      --max_predictions_per_seq=20 --size=mini --batch_size=32

What this measures on a CPU is the share of the work that is real under XLA, not an accelerator's
speed: no GPU or TPU was available. Batch sizes count rows for both variants.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("padded-xla", "packed-xla", "padded-graph-skip")


def worker(args) -> dict:
    """One variant: warm up (compile), then time args.steps steps. Prints one JSON line."""
    sys.path.insert(0, REPO)
    import numpy as np
    import tensorflow as tf

    from bert_tf.configs import BertConfig
    from bert_tf.tokenization import load_vocab
    from bert_tf.training import pretraining
    from bert_tf.training import strategy as strategy_lib
    from bert_tf.training.loop import TrainSettings

    xla = args.worker.endswith("-xla")
    vocab = len(load_vocab(args.vocab_file)) if args.vocab_file else 30522
    config = pretraining.PretrainingConfig(
        bert_config=BertConfig.named(args.size, vocab_size=vocab, max_position_embeddings=max(512, args.max_seq_length)),
        input_files=[args.input_file], output_dir=os.path.join(args.work_dir, args.worker),
        max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq, do_train=True,
        train_batch_size=args.batch_size, num_train_steps=10 ** 6, num_warmup_steps=10,
        pack_sequences=args.worker.startswith("packed"),
        train=TrainSettings(learning_rate=1e-4, iterations_per_loop=1, save_checkpoints_steps=10 ** 9,
                            jit_compile=xla))
    config.validate()
    trainer = pretraining.build_trainer(config, strategy_lib.get_strategy("one_device"))
    dataset = pretraining._dataset_fn(config, config.input_files, is_training=True)(None, args.batch_size)
    batches = list(dataset.take(args.warmup + args.steps))

    def real_tokens(batch):
        key = "sequence_ids" if "sequence_ids" in batch else "input_mask"
        return int(np.count_nonzero(batch[key].numpy()))

    step = trainer._grad_fn  # the compiled forward + backward the Trainer runs each step
    for batch in batches[:args.warmup]:
        step(batch)
    tokens = sum(real_tokens(b) for b in batches[args.warmup:])
    start, cpu = time.perf_counter(), time.process_time()
    for batch in batches[args.warmup:]:
        out = step(batch)
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    slots = args.steps * args.batch_size * args.max_seq_length
    return {"variant": args.worker, "wall": wall, "cpu": cpu, "real_tokens": tokens, "slots": slots,
            "traces": step.experimental_get_tracing_count()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input_file", required=True, help="original-format pretraining TFRecords")
    parser.add_argument("--vocab_file", default=None)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=20)
    parser.add_argument("--size", default="mini", help="BertConfig.named size: tiny, mini, small, medium, base")
    parser.add_argument("--batch_size", type=int, default=32, help="rows per step, both variants")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--work_dir", default="/tmp/bench_packing")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if not os.path.exists(args.input_file):
        sys.exit(f"bench_packing.py: error: --input_file={args.input_file}: no such file")
    results = {}
    for r in range(args.rounds):
        for variant in args.variants.split(","):
            cmd = [sys.executable, __file__, f"--worker={variant}"] + [
                f"--{k}={v}" for k, v in vars(args).items() if v is not None and k not in ("worker", "variants")]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
            if proc.returncode != 0:
                print(f"{variant}: failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results.setdefault(variant, []).append(res)
            print(f"round {r + 1} {variant}: {res['real_tokens'] / res['wall']:.0f} real tokens/s "
                  f"(efficiency {res['real_tokens'] / res['slots']:.3f}, traces {res['traces']})", flush=True)
    best = {v: max(rs, key=lambda x: x["real_tokens"] / x["wall"]) for v, rs in results.items()}
    print(f"\nBERT-{args.size}, seq {args.max_seq_length}, {args.batch_size} rows per step, {args.steps} timed steps, "
          f"best of {args.rounds} rounds")
    print(f"{'variant':20s} {'real tok/s':>11s} {'CPU-s/1k real tok':>18s} {'efficiency':>10s} {'traces':>6s}")
    for v, res in best.items():
        print(f"{v:20s} {res['real_tokens'] / res['wall']:11.0f} {1000 * res['cpu'] / res['real_tokens']:18.3f} "
              f"{res['real_tokens'] / res['slots']:10.3f} {res['traces']:6d}")
    if "packed-xla" in best and "padded-xla" in best:
        p, q = best["packed-xla"], best["padded-xla"]
        rate = (p["real_tokens"] / p["wall"]) / (q["real_tokens"] / q["wall"])
        gain = (p["real_tokens"] / p["slots"]) / (q["real_tokens"] / q["slots"])
        print(f"packed / padded real-token rate {rate:.2f}x; efficiency gain {gain:.2f}x; target >= 0.9 x gain = "
              f"{0.9 * gain:.2f}x: {'met' if rate >= 0.9 * gain else 'NOT met'}")
    if "packed-xla" in best and "padded-graph-skip" in best:
        p, c = best["packed-xla"], best["padded-graph-skip"]
        print(f"packed + XLA / CPU default (graph, skip_padding): "
              f"{(p['real_tokens'] / p['wall']) / (c['real_tokens'] / c['wall']):.2f}x")


if __name__ == "__main__":
    main()
