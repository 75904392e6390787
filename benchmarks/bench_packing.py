"""Packed against padded pretraining under XLA: real (non-padding) tokens per second, in one run.

Times the Trainer's compiled gradient step of the same BERT pretrainer (forward + backward with
dropout as in training, `jit_compile=True`; the optimizer update, the same for every variant, is
left out) on the same pretraining records read two ways:
  padded   one instance per row (pipelines.pretraining_dataset), as TPU/GPU BERT runs do today
  packed   several instances per row (packing.packed_pretraining_dataset, run_pretraining --pack_sequences)
and, for reference, the CPU default: graph mode with skip_padding (no XLA, unpacked).
`--mode=finetuning` times the classifier's compiled gradient step instead (BertClassifier, its
classification loss) on a GLUE-like length mix at seq 128 (GLUE_LIKE_MIX), padded one example per row
against packed (packing.pack_examples, run_classifier --pack_sequences).
Each variant runs in its own process, one after another, round after round; the report gives
real tokens/s (tokens of instances, not of padding), the packing efficiency of the timed batches,
and the issue's check: packed rate / padded rate >= 0.9 x (packed efficiency / padded efficiency),
i.e. the block-diagonal mask, gathers and bookkeeping of packing cost at most 10% of what removing
the padding gains.

  python create_pretraining_data.py --input_file=kjv.txt --output_file=/tmp/kjv128.tfrecord \
      --vocab_file=vocab.txt --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=1
  python benchmarks/bench_packing.py --input_file=/tmp/kjv128.tfrecord --max_seq_length=128 \
      --max_predictions_per_seq=20 --size=mini --batch_size=32
  python benchmarks/bench_packing.py --mode=finetuning --max_seq_length=128 --size=mini --batch_size=32

What this measures on a CPU is the share of the work that is real under XLA, not an accelerator's
speed: no GPU or TPU was available. Batch sizes count rows for both variants.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("padded-xla", "packed-xla", "padded-graph-skip")
FINETUNING_VARIANTS = ("padded-xla", "packed-xla")
# The fine-tuning mix, in wordpieces with [CLS]/[SEP] (one third each): (task, median, log-normal sigma).
# Medians near the GLUE training sets' (CoLA single sentences ~11, SST-2 phrases and sentences ~13,
# MRPC sentence pairs ~52); the bundled GLUE fixtures hold a few rows per task, too few to sample from.
GLUE_LIKE_MIX = (("CoLA", 11, 0.45), ("SST-2", 13, 0.7), ("MRPC", 52, 0.3))


def glue_like_lengths(num: int, max_seq_length: int, rng):
    """num example lengths drawn from GLUE_LIKE_MIX, clipped to [4, max_seq_length], shuffled."""
    parts = [rng.lognormal(math.log(median), sigma, size=num // len(GLUE_LIKE_MIX) + 1)
             for _, median, sigma in GLUE_LIKE_MIX]
    lengths = np.clip(np.concatenate(parts).astype(int), 4, max_seq_length)
    return rng.permutation(lengths)[:num]


def worker(args) -> dict:
    """One variant: warm up (compile), then time args.steps steps. Prints one JSON line."""
    sys.path.insert(0, REPO)
    from bert_tf.configs import BertConfig
    from bert_tf.runners import pretraining
    from bert_tf.runners.pretraining_config import PretrainingConfig
    from bert_tf.tokenization import load_vocab
    from bert_tf.training import strategy as strategy_lib
    from bert_tf.training.settings import TrainSettings

    xla = args.worker.endswith("-xla")
    vocab = len(load_vocab(args.vocab_file)) if args.vocab_file else 30522
    if args.mode == "finetuning":
        trainer, batches = _finetuning_step(args, vocab, xla)
        return _time_step(args, trainer, batches)
    config = PretrainingConfig(
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
    return _time_step(args, trainer, batches)


def _finetuning_step(args, vocab: int, xla: bool):
    """(a Trainer of BertClassifier with the classification loss, warmup + steps batches of the length mix)."""
    import tensorflow as tf

    from bert_tf.configs import BertConfig
    from bert_tf.data.packing import pack_examples
    from bert_tf.models import BertClassifier, BertEncoder
    from bert_tf.runners.classifier import classification_loss
    from bert_tf.runners.common import PACKED_INPUTS
    from bert_tf.training import optimizer as optimizer_lib
    from bert_tf.training import strategy as strategy_lib
    from bert_tf.training.loop import Trainer
    from bert_tf.training.settings import TrainSettings

    rng = np.random.default_rng(0)
    seq, rows = args.max_seq_length, (args.warmup + args.steps) * args.batch_size
    lengths = glue_like_lengths(rows * (seq // 8), seq, rng)  # far more examples than the padded rows need
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    arrays = {"input_ids": rng.integers(1000, vocab, size=mask.shape).astype(np.int32) * mask, "input_mask": mask,
              "segment_ids": ((np.arange(seq)[None, :] >= lengths[:, None] // 2) * mask).astype(np.int32),
              "label_ids": rng.integers(0, 2, size=len(lengths)).astype(np.int32),
              "is_real_example": np.ones(len(lengths), np.int32)}
    keys = ("input_ids", "input_mask", "segment_ids", "label_ids", "is_real_example")
    if args.worker.startswith("packed"):
        arrays = pack_examples(arrays).arrays
        keys = PACKED_INPUTS + ("label_ids", "is_real_example")
    if len(arrays["input_ids"]) < rows:
        raise SystemExit(f"the mix fills only {len(arrays['input_ids'])} rows, fewer than {rows}")
    batches = [{k: tf.constant(arrays[k][i:i + args.batch_size]) for k in keys}
               for i in range(0, rows, args.batch_size)]
    config = BertConfig.named(args.size, vocab_size=vocab, max_position_embeddings=max(512, seq))
    settings = TrainSettings(learning_rate=1e-4, iterations_per_loop=1, save_checkpoints_steps=10 ** 9,
                             jit_compile=xla)
    trainer = Trainer(strategy_lib.get_strategy("one_device"), settings,
                      lambda: BertClassifier(BertEncoder(config), 2, skip_padding=not xla), classification_loss,
                      optimizer_lib.optimizer_fn(settings, 10 ** 6, 10), model_dir=os.path.join(args.work_dir, args.worker),
                      train_steps=10 ** 6, global_batch_size=args.batch_size)
    return trainer, batches


def _time_step(args, trainer, batches) -> dict:
    """Warm up (compile) the Trainer's gradient step, then time args.steps steps."""
    import tensorflow as tf

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
    parser.add_argument("--mode", default="pretraining", choices=("pretraining", "finetuning"))
    parser.add_argument("--input_file", default=None, help="original-format pretraining TFRecords (pretraining)")
    parser.add_argument("--vocab_file", default=None)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=20)
    parser.add_argument("--size", default="mini", help="BertConfig.named size: tiny, mini, small, medium, base")
    parser.add_argument("--batch_size", type=int, default=32, help="rows per step, both variants")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=None, help="default: every variant of the mode")
    parser.add_argument("--work_dir", default="/tmp/bench_packing")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if args.mode == "pretraining" and not (args.input_file and os.path.exists(args.input_file)):
        sys.exit(f"bench_packing.py: error: --input_file={args.input_file}: no such file")
    if args.variants is None:
        args.variants = ",".join(VARIANTS if args.mode == "pretraining" else FINETUNING_VARIANTS)
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
    # On a shared machine wall time also counts other processes' turns: the rates per CPU-second
    # (the rounds' best) are the second reading of every ratio.
    cpu_rate = {v: max(x["real_tokens"] / x["cpu"] for x in rs) for v, rs in results.items()}
    print(f"\n{args.mode}: BERT-{args.size}, seq {args.max_seq_length}, {args.batch_size} rows per step, {args.steps} timed steps, "
          f"best of {args.rounds} rounds")
    print(f"{'variant':20s} {'real tok/s':>11s} {'real tok/CPU-s':>15s} {'efficiency':>10s} {'traces':>6s}")
    for v, res in best.items():
        print(f"{v:20s} {res['real_tokens'] / res['wall']:11.0f} {cpu_rate[v]:15.0f} "
              f"{res['real_tokens'] / res['slots']:10.3f} {res['traces']:6d}")
    if "packed-xla" in best and "padded-xla" in best:
        p, q = best["packed-xla"], best["padded-xla"]
        rate = (p["real_tokens"] / p["wall"]) / (q["real_tokens"] / q["wall"])
        per_cpu = cpu_rate["packed-xla"] / cpu_rate["padded-xla"]
        gain = (p["real_tokens"] / p["slots"]) / (q["real_tokens"] / q["slots"])
        print(f"packed / padded real-token rate {rate:.2f}x (per CPU-second {per_cpu:.2f}x); efficiency gain "
              f"{gain:.2f}x; target >= 0.9 x gain = {0.9 * gain:.2f}x: {'met' if rate >= 0.9 * gain else 'NOT met'} "
              f"({'met' if per_cpu >= 0.9 * gain else 'NOT met'} per CPU-second)")
    if "packed-xla" in best and "padded-graph-skip" in best:
        p, c = best["packed-xla"], best["padded-graph-skip"]
        print(f"packed + XLA / CPU default (graph, skip_padding): "
              f"{(p['real_tokens'] / p['wall']) / (c['real_tokens'] / c['wall']):.2f}x "
              f"(per CPU-second {cpu_rate['packed-xla'] / cpu_rate['padded-graph-skip']:.2f}x)")


if __name__ == "__main__":
    main()
