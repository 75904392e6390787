"""Does cuDNN's fused attention (attention_implementation="cudnn") compute what the default attention does?

On a GPU: two pretrainers with the same weights, one per attention implementation, one XLA-compiled
training step each (forward, loss, gradients) on the same batch; their losses and every gradient
must agree within bfloat16 rounding, without dropout (hidden and attention dropout 0: the two draw
different masks). Then the dropout variant (attention dropout 0.1): a finite loss, and whether two
calls of the compiled step draw different masks (cuDNN's seed is a constant of the compiled call).
On a CPU (no cuDNN): the step's HLO only, with the custom calls it holds.

  python benchmarks/check_fused_attention.py --out_dir=$OUT/check      # BERT-base width, 2 layers
  python benchmarks/check_fused_attention.py --tiny                      # CPU dry run

Writes fused_attention_check.json to --out_dir; exits 1 when a GPU run disagrees (the GPU session
then leaves +cudnn out of its matrix), 0 otherwise.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="hidden 128, 2 heads: a CPU dry run")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--out_dir", default=os.environ.get("OUT"))
    args = parser.parse_args()

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
    for a, b in zip(reference.variables, fused.variables, strict=True):
        b.assign(a)
    fused_step = compiled_step(fused)
    result = dict(device=(tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
                          .get("device_name", "GPU") if on_gpu else "CPU (HLO only)"),
                  shape=dict(batch=args.batch, seq=args.seq, hidden=config.hidden_size, heads=config.num_attention_heads),
                  precision=args.precision,
                  custom_calls=custom_call_targets(fused_step.experimental_get_compiler_ir(features)(stage="hlo")))
    ok = len(result["custom_calls"]) == 2 * config.num_hidden_layers  # a forward and a backward call per layer
    if on_gpu:
        differences = compare(compiled_step(reference)(features), fused_step(features))
        result["relative_differences"] = differences
        result["largest_relative_difference"] = max(differences.values())
        ok = result["largest_relative_difference"] <= RELATIVE_TOLERANCE
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
    print(json.dumps(result, indent=1))
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "fused_attention_check.json"), "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
