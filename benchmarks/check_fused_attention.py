"""Does cuDNN's fused attention (attention_implementation="cudnn") compute what the default attention does?

On a GPU: two pretrainers with the same weights, one per attention implementation, one XLA-compiled
training step each (forward, loss, gradients) on the same batch; their losses and every gradient
must agree within bfloat16 rounding, without dropout (hidden and attention dropout 0: the two draw
different masks); the same for attention_implementation="cudnn_btnh" (q/k/v without the head
transposes) against both. Then the dropout variant (attention dropout 0.1): a finite loss, and whether
two calls of the compiled step draw different masks (cuDNN's seed is a constant of the compiled call).

Before TensorFlow starts here, the dropout masks themselves (--dropout_probe, a process per XLA
setting, since XLA_FLAGS is read once per process: DROPOUT_SETTINGS): fused_attention alone with dropout
0.1 on uniform probabilities and one-hot values, so the output is the dropped probabilities. Two calls
of one compiled function must differ (cuDNN's Philox offset advances per execution; under command
buffers, CUDA graphs, the recorded call might repeat it), and the share of probabilities kept must be
within KEEP_TOLERANCE of 1 - rate (some cuDNN kernels round the rate to steps of 1/16: 0.9 kept would
read 0.875 or 0.9375). Whether a second compiled function repeats the first one's masks (each
executable's offset starts at 0) is reported, not judged. Each setting appends a line to
dropout_masks.jsonl in --out_dir. On a CPU (no cuDNN): the step's HLO only, with the custom calls it
holds; the probes lower theirs and report no masks.

  python benchmarks/check_fused_attention.py --out_dir=$OUT/check      # BERT-base width, 2 layers
  python benchmarks/check_fused_attention.py --tiny                      # CPU dry run

Writes fused_attention_check.json to --out_dir (agrees: cudnn; btnh.agrees; dropout_ok: every probe
passed); exits 1 when cudnn disagrees (the GPU session then leaves +cudnn and +btnh out of its matrix),
0 otherwise (the session reads btnh.agrees and dropout_ok from the file).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

# bfloat16 keeps 8 bits of mantissa: two orders of summation differ by a few units of 2^-8 relative to
# the values summed. A gradient agrees when its largest difference is within this share of its largest value.
RELATIVE_TOLERANCE = 0.05
# The dropout probes: the XLA setting of each probe's process (appended to XLA_FLAGS). TF 2.20's XLA records
# the cuDNN fMHA calls in command buffers under the CUDNN command type (command_buffer_scheduling.cc), so the
# default types minus CUDNN leave fused attention out. The default setting lowers the smallest graph to one
# command, so the probe's few kernels are recorded as a training step's are.
DROPOUT_SETTINGS = {
    "command_buffers_default": "--xla_gpu_graph_min_graph_size=1",
    "fused_attention_outside_command_buffers": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL",
}
DROPOUT_RATE = 0.1
KEEP_TOLERANCE = 0.01  # keep share within 1 percentage point of 1 - rate (65,536 draws: sigma 0.0012)


def batch(size, seq, preds, vocab, seed=0):
    """One pretraining batch in the original's names, ~15% padding, real tokens first."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(int(seq * 0.7), seq + 1, size=size)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    positions = np.sort(np.stack([rng.choice(np.arange(1, n - 1), preds, replace=False) for n in lengths]), 1)
    return dict(input_ids=rng.integers(1000, vocab, size=(size, seq)).astype(np.int32) * mask, input_mask=mask,
                segment_ids=np.zeros((size, seq), np.int32), masked_lm_positions=positions.astype(np.int32),
                masked_lm_ids=rng.integers(1000, vocab, size=(size, preds)).astype(np.int32),
                masked_lm_weights=np.ones((size, preds), np.float32),
                next_sentence_labels=rng.integers(0, 2, size=(size, 1)).astype(np.int32))


def compiled_step(model):
    import tensorflow as tf

    @tf.function(jit_compile=True, autograph=False)
    def step(features):
        with tf.GradientTape() as tape:
            loss = model(features, training=True)["loss"]
        # Dense gradients: the embedding's arrives as IndexedSlices (a gather's gradient).
        return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

    return step


def build(config, implementation, precision):
    from bert_tf.models.encoder import BertEncoder
    from bert_tf.models.pretrainer import BertPretrainer
    from bert_tf.training.step import dtype_policy

    with dtype_policy(precision):
        return BertPretrainer(config, encoder=BertEncoder(config, attention_implementation=implementation),
                              skip_padding=False)


def compare(reference, candidate):
    """{name: relative difference} of the candidate's loss and gradients against the reference's."""
    out = {"loss": abs(float(candidate[0]) - float(reference[0])) / max(abs(float(reference[0])), 1e-6)}
    for i, (a, b) in enumerate(zip(reference[1], candidate[1], strict=True)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        out[f"grad_{i}"] = float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-12))
    return out


def custom_call_targets(hlo: str):
    return re.findall(r'custom_call_target="([^"]+)"', hlo)


def dropout_probe(setting, out_dir):
    """One process's dropout check (DROPOUT_SETTINGS[setting] already in XLA_FLAGS): q = 0 makes every
    probability 1/T, v[t] = e_t makes the output row the dropped probabilities, kept ones 1/(T (1 - rate))."""
    import tensorflow as tf

    from bert_tf.layers.fused_attention import fused_attention

    batch, heads, length = 4, 4, 64  # head size = length: v one-hot over the keys
    q = tf.zeros((batch, heads, length, length), tf.bfloat16)
    k = tf.cast(tf.random.stateless_normal((batch, heads, length, length), (1, 2)), tf.bfloat16)
    v = tf.cast(tf.broadcast_to(tf.eye(length), (batch, heads, length, length)), tf.bfloat16)
    lengths = tf.fill([batch], length)

    def compiled():
        return tf.function(lambda q, k, v: fused_attention(q, k, v, lengths, lengths, 0.125, DROPOUT_RATE, seed=1234),
                           jit_compile=True, autograph=False)

    first, second = compiled(), compiled()
    hlo = first.experimental_get_compiler_ir(q, k, v)(stage="hlo")
    result = dict(setting=setting, xla_flags=os.environ.get("XLA_FLAGS", ""), rate=DROPOUT_RATE,
                  custom_calls=custom_call_targets(hlo))
    if not tf.config.list_physical_devices("GPU"):
        result.update(device="CPU (HLO only)", ok=result["custom_calls"] == ["__cudnn$fmhaSoftmaxDropout"])
    else:
        optimized = first.experimental_get_compiler_ir(q, k, v)(stage="optimized_hlo")
        outputs = [np.asarray(f(q, k, v), np.float32) for f in (first, first, second, second)]
        result.update(
            device=tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
                "device_name", "GPU"),
            fmha_in_command_buffer=fmha_in_command_buffer(optimized), **mask_statistics(outputs, length))
    print(json.dumps(result))
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "dropout_masks.jsonl"), "a") as f:
            f.write(json.dumps(result) + "\n")
    return result


def mask_statistics(outputs, length, rate=DROPOUT_RATE) -> dict:
    """The probe's verdict from its four outputs (first function twice, second function twice), each the
    dropped probabilities: 0 where dropped, 1 / (length (1 - rate)) where kept."""
    kept = np.concatenate([o[o > 0] for o in outputs])
    keep = float(np.mean([(o > 0).mean() for o in outputs]))
    out = dict(differs_between_calls=bool((outputs[0] != outputs[1]).any()),
               differs_between_calls_of_second_function=bool((outputs[2] != outputs[3]).any()),
               second_function_repeats_first=bool((outputs[0] == outputs[2]).all()),
               keep_fraction=round(keep, 5),
               # the rate cuDNN scaled the kept ones by: kept = 1 / (length (1 - rate))
               implied_scale_rate=round(1 - 1 / (float(kept.mean()) * length), 5) if kept.size else None)
    out["ok"] = (out["differs_between_calls"] and out["differs_between_calls_of_second_function"]
                 and abs(keep - (1 - rate)) <= KEEP_TOLERANCE)
    return out


def fmha_in_command_buffer(optimized_hlo: str) -> bool:
    """Whether an fMHA custom call sits inside a computation XLA's command-buffer pass made (a CUDA graph)."""
    for block in re.split(r"\n(?=\S)", optimized_hlo):
        if block.lstrip("%").startswith("command_buffer") and "__cudnn$fmha" in block:
            return True
    return False


def run_dropout_probes(out_dir) -> list:
    """Each DROPOUT_SETTINGS probe in a process of its own, before this one starts TensorFlow (the
    probes need the GPU's memory, which TensorFlow takes whole); -> their results."""
    import subprocess

    results = []
    for setting, flags in DROPOUT_SETTINGS.items():
        env = dict(os.environ, XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), flags])))
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), f"--dropout_probe={setting}",
                               *([f"--out_dir={out_dir}"] if out_dir else [])],
                              capture_output=True, text=True, env=env)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if proc.returncode == 0 and lines else dict(
            setting=setting, ok=False, failed=f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="hidden 128, 2 heads: a CPU dry run")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--out_dir", default=os.environ.get("OUT"))
    parser.add_argument("--dropout_probe", choices=list(DROPOUT_SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--skip_dropout_probes", action="store_true", help="leave out the dropout-mask processes")
    args = parser.parse_args()
    if args.dropout_probe:
        sys.exit(0 if dropout_probe(args.dropout_probe, args.out_dir)["ok"] else 1)
    probes = [] if args.skip_dropout_probes else run_dropout_probes(args.out_dir)

    import dataclasses

    import keras
    import tensorflow as tf

    from bert_tf.configs import BertConfig

    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    size = dict(hidden_size=128, num_attention_heads=2, intermediate_size=512) if args.tiny else {}
    config = BertConfig.named("base", vocab_size=30522, num_hidden_layers=2, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0, **size)
    features = {k: tf.constant(v) for k, v in batch(args.batch, args.seq, 20 if args.seq >= 64 else 3,
                                                    config.vocab_size).items()}
    keras.utils.set_random_seed(0)
    reference = build(config, "xla", args.precision)
    fused = build(config, "cudnn", args.precision)
    btnh = build(config, "cudnn_btnh", args.precision)
    for model in (fused, btnh):
        for a, b in zip(reference.variables, model.variables, strict=True):
            b.assign(a)
    fused_step, btnh_step = compiled_step(fused), compiled_step(btnh)
    result = dict(device=(tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
                          .get("device_name", "GPU") if on_gpu else "CPU (HLO only)"),
                  shape=dict(batch=args.batch, seq=args.seq, hidden=config.hidden_size, heads=config.num_attention_heads),
                  precision=args.precision,
                  custom_calls=custom_call_targets(fused_step.experimental_get_compiler_ir(features)(stage="hlo")))
    ok = len(result["custom_calls"]) == 2 * config.num_hidden_layers  # a forward and a backward call per layer
    btnh_calls = custom_call_targets(btnh_step.experimental_get_compiler_ir(features)(stage="hlo"))
    result["btnh"] = dict(custom_calls=btnh_calls, agrees=btnh_calls == result["custom_calls"])
    if on_gpu:
        reference_out, fused_out = compiled_step(reference)(features), fused_step(features)
        differences = compare(reference_out, fused_out)
        result["relative_differences"] = differences
        result["largest_relative_difference"] = max(differences.values())
        ok = result["largest_relative_difference"] <= RELATIVE_TOLERANCE
        btnh_out = btnh_step(features)
        against = {"xla": compare(reference_out, btnh_out), "cudnn": compare(fused_out, btnh_out)}
        result["btnh"].update({f"largest_relative_difference_vs_{k}": max(d.values()) for k, d in against.items()},
                              relative_differences_vs_xla=against["xla"])
        result["btnh"]["agrees"] = bool(result["btnh"]["agrees"] and max(
            max(d.values()) for d in against.values()) <= RELATIVE_TOLERANCE)
        # The dropout variant: attention dropout 0.1 (cuDNN's own mask).
        dropped = build(dataclasses.replace(config, attention_probs_dropout_prob=0.1), "cudnn", args.precision)
        for a, b in zip(reference.variables, dropped.variables, strict=True):
            b.assign(a)
        dropped_step = compiled_step(dropped)
        first, second = (float(dropped_step(features)[0]) for _ in range(2))
        result["dropout"] = dict(loss_first_call=first, loss_second_call=second,
                                 masks_change_between_calls=first != second,
                                 loss_without_dropout=float(fused_step(features)[0]))
        ok = ok and bool(np.isfinite([first, second]).all())
    else:  # the comparison's own path on the reference's step (a GPU run once failed in it, not in cuDNN)
        own = compiled_step(reference)(features)
        result["self_difference"] = max(compare(own, own).values())
        ok = ok and result["self_difference"] == 0.0
    result["agrees"] = bool(ok)
    result["dropout_masks"] = probes
    result["dropout_ok"] = all(p.get("ok") for p in probes)
    print(json.dumps(result, indent=1))
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "fused_attention_check.json"), "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
