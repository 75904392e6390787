"""Peak memory and time of a training step with and without --gradient_checkpointing (CPU).

Each measurement is a fresh process (peak RSS cannot be reset within one): it builds a BertEncoder of
BERT-base width (H 768, 12 heads, I 3072; --layers deep), runs one training step to trace it, then
--steps more, dropout on. The step is forward + backward of a loss on every position's output
(the gradient step of a Trainer, without the optimizer update, whose memory is the same either way).
Reported: the process's peak resident memory (getrusage ru_maxrss), the model-only RSS before the
first step, their difference (what the step needs above the weights), and the median step time
after the first. Times on a shared machine are indicative only.

  python benchmarks/bench_gradient_checkpointing.py --layers=4 --batch_size=2 --seq_length=512
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def measure(layers: int, batch_size: int, seq_length: int, steps: int, checkpointing: bool, jit_compile: bool) -> dict:
    """One configuration, in this process: {peak_rss_mib, model_rss_mib, step_mib, step_seconds}."""
    import numpy as np
    import tensorflow as tf

    from bert_tf.configs import BertConfig
    from bert_tf.models.encoder import BertEncoder

    config = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=max(512, seq_length))
    encoder = BertEncoder(config, gradient_checkpointing=checkpointing)
    rng = np.random.default_rng(0)
    inputs = {"input_ids": tf.constant(rng.integers(0, config.vocab_size, (batch_size, seq_length)), tf.int32),
              "input_mask": tf.ones((batch_size, seq_length), tf.int32),
              "segment_ids": tf.zeros((batch_size, seq_length), tf.int32)}

    @tf.function(jit_compile=jit_compile)
    def step(inputs):
        with tf.GradientTape() as tape:
            out = encoder(inputs, training=True)["sequence_output"]  # [B, S, H]
            loss = tf.reduce_mean(tf.square(out))
        grads = tape.gradient(loss, encoder.trainable_variables)
        return loss, tf.add_n([tf.reduce_sum(tf.convert_to_tensor(g)) for g in grads if g is not None])

    model_rss = _rss_mib()
    step(inputs)  # traced (and compiled) here
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss, total = step(inputs)
        float(total)
        times.append(time.perf_counter() - start)
    peak = _rss_mib()
    return {"peak_rss_mib": round(peak), "model_rss_mib": round(model_rss), "step_mib": round(peak - model_rss),
            "step_seconds": round(float(np.median(times)), 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4])
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--seq_length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--jit_compile", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # JSON arguments of one measurement
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(**json.loads(args.child))))
        return
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), KERAS_BACKEND="tensorflow",
               TF_CPP_MIN_LOG_LEVEL="2")
    rows = []
    for layers in args.layers:
        for checkpointing in (False, True):
            child = dict(layers=layers, batch_size=args.batch_size, seq_length=args.seq_length, steps=args.steps,
                         checkpointing=checkpointing, jit_compile=args.jit_compile)
            out = subprocess.run([sys.executable, __file__, "--child", json.dumps(child)], env=env,
                                 capture_output=True, text=True, check=True)
            row = dict(child, **json.loads(out.stdout.strip().splitlines()[-1]))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nBERT-base width, batch {args.batch_size}, seq {args.seq_length}, XLA {'on' if args.jit_compile else 'off'}"
          " (times indicative: shared machine)")
    print(f"{'layers':>6} {'checkpointing':>13} {'peak RSS MiB':>12} {'step MiB':>9} {'step s':>7}")
    for r in rows:
        print(f"{r['layers']:>6} {str(r['checkpointing']):>13} {r['peak_rss_mib']:>12} {r['step_mib']:>9} "
              f"{r['step_seconds']:>7}")


if __name__ == "__main__":
    main()
