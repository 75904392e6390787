"""What the progress reporting costs: the same fine-tuning run with automatic host calls (the default since
2026-11-28: a call of at most ~30 s and a tenth of the run, so a progress line comes that often) against
fixed calls of --fixed steps (the old default, 1000 steps per call and per log line), side by side in one
process, rounds alternating the order.

  python benchmarks/bench_progress.py --size=mini --steps=600 --rounds=3

The step is the library's own (Trainer, BertClassifier, its loss), on random token ids of one length, in
float32 on the CPU; steps/s is the run's steps over its wall time less the first call's compile time. A small
model makes the per-call cost look as large as it can be: a real model's step is longer, the calls fewer.
Prints one line per run and the ratio automatic / fixed per round and overall (the median of rounds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bert_tf.configs import BertConfig  # noqa: E402
from bert_tf.models.encoder import build_encoder  # noqa: E402
from bert_tf.models.task_models import BertClassifier  # noqa: E402
from bert_tf.runners.classifier import classification_loss  # noqa: E402
from bert_tf.training import optimizer as optimizer_lib  # noqa: E402
from bert_tf.training import strategy as strategy_lib  # noqa: E402
from bert_tf.training.loop import Trainer  # noqa: E402
from bert_tf.training.settings import TrainSettings  # noqa: E402


def make_data(examples: int, seq_length: int, vocab_size: int) -> dict:
    rng = np.random.default_rng(0)
    ids = rng.integers(5, vocab_size, size=(examples, seq_length)).astype(np.int32)
    return dict(input_ids=ids, input_mask=np.ones_like(ids), segment_ids=np.zeros_like(ids),
                label_ids=rng.integers(0, 2, size=examples).astype(np.int32))


def run_once(config: BertConfig, data: dict, steps: int, batch: int, iterations_per_loop) -> dict:
    """One fresh Trainer run of `steps` steps: steps/s after the first call, the number of host calls."""
    settings = TrainSettings(iterations_per_loop=iterations_per_loop, save_checkpoints_steps=10 ** 9, seed=1)
    trainer = Trainer(strategy_lib.get_strategy("one_device"), settings,
                      lambda: BertClassifier(build_encoder(config), 2), classification_loss,
                      lambda variables: optimizer_lib.create_optimizer("adamw", variables, 1e-4, steps, 0),
                      model_dir=tempfile.mkdtemp(prefix="bench_progress_"), train_steps=steps,
                      global_batch_size=batch)

    def dataset_fn(context, batch_size):
        return tf.data.Dataset.from_tensor_slices(data).repeat().batch(batch_size, drop_remainder=True).prefetch(2)

    start = time.perf_counter()
    trainer.train(dataset_fn)
    wall = time.perf_counter() - start
    history = trainer.loop_history
    # The first call's tracing and compiling (the loop reports it apart) is the same work either way.
    compile_seconds = history[0]["compile_seconds"]
    inside = sum(h["seconds"] for h in history)  # the calls' timed steps (all but the first step)
    return dict(steps_per_second=steps / (wall - compile_seconds), calls=len(history),
                call_steps=[h["steps"] for h in history], outside_seconds=wall - compile_seconds - inside)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="mini", help="BertConfig.named size (tiny, mini, small, ...)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--fixed", type=int, default=1000, help="the fixed variant's steps per call")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    config = BertConfig.named(args.size, vocab_size=1000)
    data = make_data(1024, args.seq, config.vocab_size)
    print(f"{args.size} (L{config.num_hidden_layers}/H{config.hidden_size}), batch {args.batch}, seq {args.seq}, "
          f"{args.steps} steps; load before {os.getloadavg()[0]:.2f}")
    ratios = []
    for round_index in range(args.rounds):
        variants = [("automatic", None), (f"fixed {args.fixed}", args.fixed)]
        if round_index % 2:
            variants.reverse()
        rates = {}
        for name, ipl in variants:
            result = run_once(config, data, args.steps, args.batch, ipl)
            rates[ipl] = result["steps_per_second"]
            print(f"round {round_index + 1} {name:>12}: {result['steps_per_second']:8.2f} steps/s, "
                  f"{result['calls']} host calls {result['call_steps'][:8]}{' ...' if result['calls'] > 8 else ''}, "
                  f"{result['outside_seconds']:.2f} s outside the calls")
        ratios.append(rates[None] / rates[args.fixed])
        print(f"round {round_index + 1}: automatic / fixed = {ratios[-1]:.3f}")
    print(f"median automatic / fixed over {args.rounds} rounds: {statistics.median(ratios):.3f} "
          f"(rounds {', '.join(f'{r:.3f}' for r in ratios)}); load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
