#!/usr/bin/env bash
# The GPU measurements of docs/accelerators.md ("Measuring on a GPU"), one phase per call, results under
# $OUT (or ./gpu_results). Run from the project root with TensorFlow, PyTorch and transformers importable:
#   bash benchmarks/gpu_session.sh matrix     # the GPU candidates within BUDGET_S seconds (default 480), by time at
#                                             # stake: smoke check (cuDNN attention in both layouts against the
#                                             # default, its dropout masks with and without command buffers:
#                                             # smoke/fused_attention_check.json, smoke/dropout_masks.jsonl),
#                                             # A/B matrix on 4 layers of BERT-base width
#                                             # (+noclock, +devfeed, +k8, +cudnn, +btnh, +cublaslt, +plain_epilogues,
#                                             # +gpu_private, ...), the best combination, the winner vs HF
#                                             # torch.compile on BERT-base with both profiles, packed vs padded,
#                                             # then fine-tuning and the accuracy check while time is left
#                                             # (benchmarks/gpu_matrix.py; DRY_RUN=1: the same on a CPU, tiny sizes;
#                                             # MINILM_DIR: the accuracy check's weights where not installed)
#   bash benchmarks/gpu_session.sh speed      # ours (bf16/fp16, XLA or not) vs HF eager / torch.compile, BERT-base
#                                             # seq 128 batch 256, with profiles and their breakdown (~8 min on an H200)
#   bash benchmarks/gpu_session.sh accuracy   # the short recipe: CPU fp32 vs GPU bf16 / fp16 under XLA, 2 seeds each
#   bash benchmarks/gpu_session.sh packed FILES   # real seq-512 records: ours packed vs the peers padded
#   bash benchmarks/gpu_session.sh smoke      # BERT-tiny, every GPU variant, 1 timed call: does it all run (~2 min)
#   bash benchmarks/gpu_session.sh bundle     # after the others: $OUT as a few files to copy off the machine:
#                                             # results.tgz (all but profiles) and all.tgz.aa, .ab, ... (15 MB parts)
# Each phase writes report.txt / results.json (bench_pretraining.py) or accuracy_report.txt (accuracy) there.
# matrix also appends one JSON line per measured variant, as each step ends, to $OUT/matrix/gpu_results.jsonl
# (date, card, model, variant, ours and HF seq/s, ratio, share of peak): after the session, append those lines
# to benchmarks/gpu_results.jsonl here (cat .../gpu_results.jsonl >> benchmarks/gpu_results.jsonl) and commit.
set -eu
out=${OUT:-gpu_results}
phase=${1:-smoke}
if [ "$phase" = bundle ]; then
  tmp=$(mktemp -d)
  tar czf "$tmp/results.tgz" -C "$out" --exclude='*.pb' --exclude='*.json.gz' --exclude='*trace*' .
  tar czf "$tmp/all.tgz" -C "$out" .
  find "$out" -mindepth 1 -delete
  cp "$tmp/results.tgz" "$out/" && split -b 15m "$tmp/all.tgz" "$out/all.tgz."
  rm -rf "$tmp"; ls -l "$out"; exit 0
fi
mkdir -p "$out/$phase"
case "$phase" in
  matrix)
    python benchmarks/gpu_matrix.py --out_dir="$out/$phase" --budget_s="${BUDGET_S:-480}" ${DRY_RUN:+--dry_run} \
      ${MINILM_DIR:+--init_checkpoint="$MINILM_DIR"} ;;
  smoke)
    python benchmarks/bench_pretraining.py --device=gpu --size=tiny --batch=32 --steps=2 --loops=1 \
      --out_dir="$out/$phase" --profile ;;
  speed)
    python benchmarks/bench_pretraining.py --device=gpu --size=base --batch=256 --steps=20 --loops=2 \
      --out_dir="$out/$phase" --xla_cache_dir="$out/xla_cache" --profile ;;
  accuracy)
    python benchmarks/bench_pretraining_accuracy.py --variants=cpu-fp32-graph,gpu-bf16-xla,gpu-fp16-xla \
      --seeds=1,2 --work_dir=/tmp/bench_pretraining_accuracy --out_dir="$out/$phase" ;;
  packed)
    python benchmarks/bench_pretraining.py --device=gpu --size=base --batch=32 --steps=10 --loops=2 \
      --input_file="${2:?records}" --pack_sequences --variants=ours-bf16-xla,hf-bf16-compile \
      --out_dir="$out/$phase" --xla_cache_dir="$out/xla_cache" ;;
  *) echo "unknown phase $phase: matrix, smoke, speed, accuracy, packed or bundle" >&2; exit 2 ;;
esac
