"""Pretraining throughput: our Trainer vs tf-models-official's BertPretrainerV2, in one run.

Sequences/s of full training steps (forward, backward, global-norm clipping,
AdamW update) at BERT-small (L4/H512/A8, vocab 30522) by default, batch 32, seq
128, 20 masked positions, ~15% padding, synthetic data held in memory. Every
variant runs in its own subprocess (fresh TensorFlow, dtype policy and thread
pools), with `--steps` steps per host call for both implementations; the
first call (tracing / XLA compilation) is not timed.

  python benchmarks/bench_pretraining.py                      # all variants, BERT-small
  python benchmarks/bench_pretraining.py --size=base --batch=8
  python benchmarks/bench_pretraining.py --variants=ours-bf16-graph,tfm-bf16-graph
  python benchmarks/bench_pretraining.py --variants=ours-fp32-graph,tfm-fp32-graph --rounds=3 --steps=2

Also reports model FLOPs utilisation against a measured matmul peak of the same
precision, the mean loss of the timed steps (bfloat16 vs float32 on the same
weights and data), and the machine's load average before and after. On a shared,
loaded machine wall-clock rates of variants run minutes apart are not comparable:
`--rounds` interleaves repeated runs, and the process CPU seconds per sequence
(which do not count time spent waiting for a core) are reported beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SIZES = {"small": (4, 512), "base": (12, 768)}  # layers, hidden
VOCAB = 30522
VARIANTS = [f"{impl}-{precision}-{mode}" for impl in ("ours", "tfm")
            for precision in ("fp32", "bf16") for mode in ("graph", "xla")]
PAD_FRACTION = 0.15


def synthetic_batches(batch, seq, preds, num=4, seed=0):
    """Numpy feature dicts in the original's names; each example has ~15% padding."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        lengths = rng.integers(int(seq * (1 - 2 * PAD_FRACTION)), seq + 1, size=batch)
        mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
        ids = rng.integers(1000, VOCAB, size=(batch, seq)).astype(np.int32) * mask
        segment = ((np.arange(seq)[None, :] >= lengths[:, None] // 2) & (mask == 1)).astype(np.int32)
        positions = np.sort(np.stack([rng.choice(np.arange(1, n - 1), preds, replace=False) for n in lengths]), 1)
        out.append(dict(
            input_ids=ids, input_mask=mask, segment_ids=segment,
            masked_lm_positions=positions.astype(np.int32),
            masked_lm_ids=rng.integers(1000, VOCAB, size=(batch, preds)).astype(np.int32),
            masked_lm_weights=np.ones((batch, preds), np.float32),
            next_sentence_labels=rng.integers(0, 2, size=(batch, 1)).astype(np.int32),
        ))
    return out


def _dataset(batches):
    import tensorflow as tf

    stacked = {k: tf.constant([b[k] for b in batches]) for k in batches[0]}
    return tf.data.Dataset.from_tensor_slices(stacked).cache().repeat().prefetch(2)


def flops_per_sequence(layers, hidden, seq, preds, vocab=VOCAB):
    """Training FLOPs (3x forward) of one sequence: dense layers, attention scores, MLM head at masked positions."""
    dense = layers * (4 * hidden * hidden + 2 * hidden * 4 * hidden) * seq * 2
    attention = layers * 2 * (2 * seq * seq * hidden)
    head = preds * (hidden * hidden + hidden * vocab) * 2 + hidden * hidden * 2 + 2 * hidden * 2
    return 3 * (dense + attention + head)


# ---------------------------------------------------------------------------- workers
class _CpuStampedList(list):
    """A list that notes the process CPU time of every append (the Trainer appends one record per loop)."""

    def __init__(self):
        super().__init__()
        self.cpu_times = []

    def append(self, item):
        self.cpu_times.append(time.process_time())
        super().append(item)


def run_ours(args, precision, xla):
    from bert_tf.configs import BertConfig
    from bert_tf.models.pretrainer import BertPretrainer
    from bert_tf.training import loop
    from bert_tf.training import optimizer as optimizer_lib
    from bert_tf.training.pretraining import pretraining_loss_fn
    from bert_tf.training.strategy import get_strategy

    layers, hidden = SIZES[args.size]
    config = BertConfig.named(args.size, vocab_size=VOCAB)
    batches = synthetic_batches(args.batch, args.seq, args.preds)
    with tempfile.TemporaryDirectory() as model_dir:
        train_config = loop.TrainConfig(
            model_dir=model_dir, train_steps=args.steps * (args.loops + 1), global_batch_size=args.batch,
            steps_per_loop=args.steps, save_checkpoints_steps=10**9, mixed_precision=precision, jit_compile=xla,
            checkpoint_input_pipeline=False)
        trainer = loop.Trainer(
            get_strategy("one_device"), train_config, lambda: BertPretrainer(config), pretraining_loss_fn,
            lambda v: optimizer_lib.create_optimizer("adamw", v, 1e-4, 10000, 0))
        trainer.loop_history = _CpuStampedList()  # CPU time between loop records = the timed loops' CPU time
        # The final step saves a checkpoint after the last timed loop; it is not timed.
        trainer.train(lambda ctx, b: _dataset(batches))
    timed = trainer.loop_history[1:]
    seconds = sum(r["seconds"] for r in timed)
    steps = sum(r["steps"] for r in timed)
    losses = trainer.step_losses[args.steps:]
    cpu = trainer.loop_history.cpu_times[-1] - trainer.loop_history.cpu_times[0]
    return dict(seq_per_s=steps * args.batch / seconds, cpu_s_per_seq=cpu / (steps * args.batch),
                loss=sum(losses) / len(losses),
                first_loss=trainer.step_losses[0], params=loop.count_parameters(trainer.model),
                flops_per_seq=flops_per_sequence(layers, hidden, args.seq, args.preds))


def run_tfm(args, precision, xla):
    import tensorflow as tf
    import tf_keras
    from official.nlp.modeling import layers as tfm_layers
    from official.nlp.modeling import models, networks

    layers, hidden = SIZES[args.size]
    if precision != "float32":
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    tf_keras.utils.set_random_seed(0)
    encoder = networks.BertEncoderV2(
        vocab_size=VOCAB, hidden_size=hidden, num_layers=layers, num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden, max_sequence_length=512, type_vocab_size=2,
        inner_activation=lambda x: tf_keras.activations.gelu(x, approximate=True))
    model = models.BertPretrainerV2(
        encoder_network=encoder,
        classification_heads=[tfm_layers.ClassificationHead(inner_dim=hidden, num_classes=2, name="next_sentence")])
    optimizer = tf_keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0)
    batches = synthetic_batches(args.batch, args.seq, args.preds)
    iterator = iter(_dataset(batches))

    def loss_fn(batch):
        outputs = model(dict(input_word_ids=batch["input_ids"], input_mask=batch["input_mask"],
                             input_type_ids=batch["segment_ids"], masked_lm_positions=batch["masked_lm_positions"]),
                        training=True)
        mlm = tf.keras.losses.sparse_categorical_crossentropy(
            batch["masked_lm_ids"], tf.cast(outputs["mlm_logits"], tf.float32), from_logits=True)
        w = batch["masked_lm_weights"]
        mlm = tf.reduce_sum(mlm * w) / (tf.reduce_sum(w) + 1e-5)
        nsp = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
            batch["next_sentence_labels"][:, 0], tf.cast(outputs["next_sentence"], tf.float32), from_logits=True))
        return mlm + nsp

    @tf.function(jit_compile=xla)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_loop(n):
        losses = tf.TensorArray(tf.float32, size=n)
        for i in tf.range(n):
            losses = losses.write(i, step(next(iterator)))
        return losses.stack()

    n = tf.constant(args.steps)
    first = train_loop(n).numpy()
    seconds, losses = 0.0, []
    cpu_start = time.process_time()
    for _ in range(args.loops):
        start = time.time()
        losses.extend(train_loop(n).numpy().tolist())
        seconds += time.time() - start
    sequences = args.loops * args.steps * args.batch
    return dict(seq_per_s=sequences / seconds, cpu_s_per_seq=(time.process_time() - cpu_start) / sequences,
                loss=sum(losses) / len(losses),
                first_loss=float(first[0]), params=int(sum(tf.size(v) for v in model.trainable_variables)),
                flops_per_seq=flops_per_sequence(layers, hidden, args.seq, args.preds))


def matmul_peak(dtype_name, n=1024, reps=8, trials=3):
    """FLOP/s of independent square matmuls in graph mode, best of `trials` (the practical peak)."""
    import tensorflow as tf

    dtype = tf.bfloat16 if dtype_name == "bf16" else tf.float32
    a = tf.cast(tf.random.normal((reps, n, n)), dtype)
    b = tf.cast(tf.random.normal((n, n)), dtype)

    @tf.function
    def mm():
        return tf.reduce_sum(tf.cast(tf.matmul(a, b), tf.float32))

    mm().numpy()
    best = float("inf")
    for _ in range(trials):
        start = time.time()
        mm().numpy()
        best = min(best, time.time() - start)
    return 2 * n**3 * reps / best


def worker(args):
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    if args.worker.startswith("peak-"):
        print("RESULT" + json.dumps(dict(flops=matmul_peak(args.worker.split("-")[1]))))
        return
    impl, precision, mode = args.worker.split("-")
    precision = {"fp32": "float32", "bf16": "bfloat16"}[precision]
    fn = run_ours if impl == "ours" else run_tfm
    print("RESULT" + json.dumps(fn(args, precision, mode == "xla")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--preds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=3, help="steps per host call (timed calls: --loops)")
    parser.add_argument("--loops", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the variant list this many times, interleaved, and keep each variant's best")
    parser.add_argument("--inter_op_threads", type=int, default=1,
                        help="TensorFlow inter-op threads in every variant (1 ran ~1.5x faster on a 2-core CPU)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    base = [sys.executable, os.path.abspath(__file__)] + [
        f"--{k}={getattr(args, k)}" for k in ("size", "batch", "seq", "preds", "steps", "loops", "inter_op_threads")]

    def run(name):
        proc = subprocess.run(base + [f"--worker={name}"], capture_output=True, text=True, env=env)
        if proc.returncode != 0 or "RESULT" not in proc.stdout:
            print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            return None
        return json.loads(proc.stdout.split("RESULT", 1)[1])

    load_before = os.getloadavg()
    started = time.time()
    peaks = {p: run(f"peak-{p}") for p in ("fp32", "bf16")}
    names = list(dict.fromkeys(args.variants.split(",")))
    rounds = {name: [] for name in names}  # every round's result per variant, rounds interleaved
    for r in range(args.rounds):
        for name in names:
            result = run(name)
            if result:
                rounds[name].append(result)
                print(f"round {r + 1} {name:18s} {result['seq_per_s']:7.2f} seq/s "
                      f"{result['cpu_s_per_seq']:6.3f} CPU-s/seq  load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    # Best round per variant: the highest wall-clock rate, and the least CPU time per sequence
    # (steadier than wall time on a shared machine: it does not count time spent waiting for a core).
    results = {}
    for name, rs in rounds.items():
        if rs:
            results[name] = dict(max(rs, key=lambda r: r["seq_per_s"]),
                                 cpu_s_per_seq=min(r["cpu_s_per_seq"] for r in rs))

    print(f"\nBERT-{args.size}, batch {args.batch}, seq {args.seq}, {args.preds} masked positions, "
          f"{args.loops}x{args.steps} timed steps per variant, best of {args.rounds} interleaved round(s), "
          f"inter-op threads {args.inter_op_threads}")
    print(f"matmul peak: fp32 {peaks['fp32']['flops'] / 1e9:.1f} GFLOP/s, "
          f"bf16 {peaks['bf16']['flops'] / 1e9:.1f} GFLOP/s" if all(peaks.values()) else "matmul peak: n/a")
    ok = results
    best_peer = max((v["seq_per_s"] for k, v in ok.items() if k.startswith("tfm")), default=None)
    least_peer_cpu = min((v["cpu_s_per_seq"] for k, v in ok.items() if k.startswith("tfm")), default=None)
    print(f"{'variant':18s} {'seq/s':>8s} {'vs best tfm':>11s} {'CPU-s/seq':>9s} {'vs tfm':>7s} {'MFU':>6s} "
          f"{'loss':>8s} {'params':>11s}")
    for name, r in ok.items():
        peak = peaks.get(name.split("-")[1])
        mfu = r["seq_per_s"] * r["flops_per_seq"] / peak["flops"] if peak else float("nan")
        ratio = r["seq_per_s"] / best_peer if best_peer else float("nan")
        cpu_ratio = least_peer_cpu / r["cpu_s_per_seq"] if least_peer_cpu else float("nan")
        print(f"{name:18s} {r['seq_per_s']:8.2f} {ratio:10.2f}x {r['cpu_s_per_seq']:9.3f} {cpu_ratio:6.2f}x "
              f"{100 * mfu:5.1f}% {r['loss']:8.4f} {r['params']:11,d}")
    best_ours = max((v["seq_per_s"] for k, v in ok.items() if k.startswith("ours")), default=None)
    if best_ours and best_peer:
        print(f"best ours / best tf-models-official: {best_ours / best_peer:.2f}x wall-clock", end="")
        least_ours_cpu = min(v["cpu_s_per_seq"] for k, v in ok.items() if k.startswith("ours"))
        print(f", {least_peer_cpu / least_ours_cpu:.2f}x by CPU time per sequence")
    # Same-round ratios of each ours variant to its tfm counterpart (same precision and mode).
    for name in names:
        peer = "tfm" + name[len("ours"):]
        if name.startswith("ours") and rounds.get(peer) and rounds[name]:
            pairs = list(zip(rounds[name], rounds[peer], strict=False))  # a failed round shortens one list
            print(f"{name} / {peer} per round: " + ", ".join(
                f"{a['seq_per_s'] / b['seq_per_s']:.2f}x wall {b['cpu_s_per_seq'] / a['cpu_s_per_seq']:.2f}x CPU"
                for a, b in pairs))
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"({os.cpu_count()} CPUs); took {time.time() - started:.0f}s")


if __name__ == "__main__":
    main()
