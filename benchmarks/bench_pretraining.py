"""Pretraining throughput: our Trainer vs tf-models-official and Hugging Face (PyTorch), in one run.

tf-models-official's BertPretrainerV2 and transformers' BertForPreTraining are the peers.
Sequences/s of full training steps (forward, backward, global-norm clipping,
AdamW update) at BERT-small (L4/H512/A8, vocab 30522) by default, batch 32, seq
128, 20 masked positions, ~15% padding, synthetic data held in memory (the same
batches for every variant, one per step of a host call). Every variant runs in
its own subprocess (fresh TensorFlow or PyTorch, dtype policy and thread pools),
with `--steps` steps per host call; the first call (tracing / XLA or
torch.compile compilation) is not timed.

Variants, `{impl}-{precision}-{mode}`:
  ours-*   our Trainer (bert_tf), graph or xla, fp32 or bf16 (mixed precision)
  tfm-*    tf-models-official BertPretrainerV2 with tf_keras AdamW, graph or xla, fp32 or bf16
  hf-*     transformers BertForPreTraining (tanh GELU, sdpa attention, MLM head only at the masked
           positions), fused torch AdamW, 2 threads; eager or torch.compile of forward+loss,
           fp32 or bf16 (torch.autocast)
  ours-*-xla+OPTION[+OPTION...]   a GPU candidate (MODEL_OPTIONS, XLA_PRESETS): +cudnn (cuDNN fused
           attention), +whole (the whole step as one XLA program), +adrop0 (attention dropout 0),
           +noclock (the host enqueues the next step without waiting for this one's outputs), +devfeed
           (batches prefetched onto the device), +k8 (8 whole steps per compiled program, fed as +devfeed;
           needs +whole), +plain_epilogues (bias+GELU and LayerNorm as plain ops), +cb_off / +cb_fusion (XLA command buffers off / fusions
           only), +triton_off (no Triton GEMMs), +cublaslt, +cudnn_ln (XLA flags of the variant's own
           process), +gpu_private (TF_GPU_THREAD_MODE=gpu_private there); benchmarks/gpu_matrix.py runs them.
           Without +noclock ours keeps the input-wait clock (the scripts' default before 2026-11-28, so the
           figures compare with the earlier GPU runs'); the scripts now leave it off on a GPU.

  pip install torch==2.13.0 transformers                      # for the hf-* variants (CPU build)
  python benchmarks/bench_pretraining.py                      # all variants, BERT-small
  python benchmarks/bench_pretraining.py --size=base --batch=8
  python benchmarks/bench_pretraining.py --variants=ours-bf16-graph,tfm-bf16-graph,hf-bf16-eager
  python benchmarks/bench_pretraining.py --variants=ours-fp32-graph,tfm-fp32-graph --rounds=3 --steps=2
  python benchmarks/bench_pretraining.py --input_file=pretraining_data/*.tfrecord --steps=10
  python benchmarks/bench_pretraining.py --device=gpu --size=base --batch=256 --steps=20   # on a GPU machine
  python benchmarks/bench_pretraining.py --device=gpu --input_file=seq512/*.tfrecord --pack_sequences

On a GPU (--device=gpu, or auto when `nvidia-smi` lists one) the default variants are GPU_VARIANTS:
ours in bf16 and fp16 (dynamic loss scaling), with and without XLA, and Hugging Face on CUDA in bf16
autocast (sdpa attention, fused AdamW), eager and under torch.compile; every variant's batches are
on the device before the first step (PyTorch: moved once; ours: a cached, prefetched dataset).
Timing is synchronised with the device: a timed call ends when its step losses are on the host
(ours: the host loop fetches them; PyTorch: torch.cuda.synchronize, then .tolist()). The first call of
each variant (tracing, XLA or torch.compile compilation, cuBLAS/cuDNN autotuning) is reported as
"compile s": its time minus that of a steady call of as many steps. The matmul peak multiplies
distinct operands in every product (a batch of independent [n, n] x [n, n] pairs), so no graph
optimiser can fold or reuse a product; model FLOPs utilisation (MFU) divides each variant's model
FLOP/s by the best peak measured for its precision on that device (TensorFlow's or PyTorch's).
Every figure is printed with the device's name (the GPU's, or the CPU's model and core count), and
the whole report, with each round's raw results, is written to --out_dir (default: $OUT when set)
as results.json and report.txt.

--profile (with --out_dir) runs each ours-* and hf-* variant for one more host call of up to
PROFILE_STEPS steps after the timed ones, under TensorFlow's profiler (the Trainer's --profile_steps)
or torch.profiler, keeps the traces under <out_dir>/profile/<variant>/, and adds their breakdown by
kernel class side by side (benchmarks/trace_summary.py) to the report.

With --pack_sequences (needs --input_file) ours trains on the same records packed several to a row
(run_pretraining --pack_sequences; the first batches of packed rows of those records), the peers on
them padded one to a row, as a user of theirs would; compare the real (non-padding) tokens/s column.

With --input_file every variant trains on the first (--loops + 1) x --steps batches of real
pretraining records (file order, read once through run_pretraining's pipeline), a new batch
each step, so the timed calls also pay what a real run pays for batches it has not seen (new
shapes for ours) and the padding is the data's own; --seq and --preds come from the records.
The ids must fit the benchmark's vocab of 30522 (any BERT uncased or cased vocab does).

Also reports model FLOPs utilisation against a measured matmul peak of the same
precision (TensorFlow's for ours/tfm, PyTorch's for hf), the mean loss of the
timed steps (bfloat16 vs float32 on the same data), and the machine's load
average before and after. The "vs best peer" columns compare with the best
tf-models-official or Hugging Face variant of the run. On a shared, loaded
machine wall-clock rates of variants run minutes apart are not comparable:
`--rounds` interleaves repeated runs, and the process CPU seconds per sequence
(which do not count time spent waiting for a core) are reported beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from bert_tf.training import xla_gpu

# layers, hidden (tiny: tests; base4: BERT-base's width and per-layer kernels in 4 layers, a fraction of its
# compile time: the GPU candidates' A/B matrix, benchmarks/gpu_matrix.py)
SIZES = {"tiny": (2, 128), "small": (4, 512), "base4": (4, 768), "base": (12, 768)}
VOCAB = 30522
# The CPU's default variants (fp16 has no fast CPU kernels: ours-fp16-* only on request).
VARIANTS = [f"{impl}-{precision}-{mode}" for impl in ("ours", "tfm")
            for precision in ("fp32", "bf16") for mode in ("graph", "xla")] + [
    f"hf-{precision}-{mode}" for precision in ("fp32", "bf16") for mode in ("eager", "compile")]
GPU_VARIANTS = [f"ours-{precision}-{mode}" for precision in ("bf16", "fp16") for mode in ("xla", "graph")] + [
    "hf-bf16-eager", "hf-bf16-compile"]
KNOWN_VARIANTS = list(dict.fromkeys(VARIANTS + GPU_VARIANTS))
# GPU candidates (docs/accelerators.md), added to an ours-*-xla variant's name with "+", any number of them
# (ours-bf16-xla+cudnn+whole): what the model or the step does differently...
MODEL_OPTIONS = {
    "cudnn": "cuDNN fused attention (BertEncoder attention_implementation='cudnn')",
    "btnh": "cuDNN fused attention on q/k/v without the head transposes (attention_implementation='cudnn_btnh'; "
            "implies cudnn)",
    "whole": "the whole step, optimizer update included, as one XLA program (TrainSettings.compile_whole_step)",
    "adrop0": "attention dropout 0 instead of 0.1 (what attention dropout costs; measured only: another recipe)",
    "noclock": "the inner loop without its input-wait clock, which holds the host until each step's outputs "
               "exist: the host enqueues the next step while the device runs this one "
               "(TrainSettings.input_wait_clock=False)",
    "devfeed": "batches prefetched onto the device by tf.distribute's input (experimental_fetch_to_device) instead "
               "of a host dataset the step copies from (TrainSettings.device_input)",
    "k8": "8 whole steps per compiled program: one XLA loop over 8 batches stacked and prefetched onto the device "
          "(TrainSettings.steps_per_program=8, implies devfeed; needs whole); its host calls run --steps rounded "
          "up to a multiple of 8",
    "plain_epilogues": "the blocks' bias+GELU, dropout+add and LayerNorm as plain ops with TensorFlow's own "
                       "gradients, which XLA's cuBLASLt epilogue and cuDNN LayerNorm can match, instead of the "
                       "fused custom-gradient kernels (BertEncoder plain_epilogues)",
}
# ...environment variables of the variant's process (read when TensorFlow starts).
ENV_PRESETS = {
    # TensorFlow's GPU launches from threads of their own, not the shared inter-op pool that tf.data also uses.
    "gpu_private": {"TF_GPU_THREAD_MODE": "gpu_private"},
}
# ...and XLA flag presets, set in the variant's process environment (XLA_FLAGS, read once when TensorFlow
# starts; appended to flags already there). Defaults in TensorFlow 2.20: command buffers (CUDA graphs) for
# FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN; Triton GEMMs on; cuBLASLt off; cuDNN LayerNorm off.
XLA_PRESETS = {
    "cb_off": "--xla_gpu_enable_command_buffer=",
    "cb_fusion": "--xla_gpu_enable_command_buffer=FUSION",
    "triton_off": "--xla_gpu_enable_triton_gemm=false",
    "cublaslt": "--xla_gpu_enable_cublaslt=true",
    "cudnn_ln": xla_gpu.CUDNN_LAYER_NORM,  # with whole: the training scripts' GPU default
}


def split_variant(name):
    """'ours-bf16-xla+cudnn+whole' -> ('ours-bf16-xla', ['cudnn', 'whole'])."""
    base, *options = name.split("+")
    return base, options


def variant_error(name):
    """Why `name` is not a variant this benchmark runs, or None."""
    base, options = split_variant(name)
    if base not in KNOWN_VARIANTS:
        return f"unknown variant {base}"
    known = [*MODEL_OPTIONS, *XLA_PRESETS, *ENV_PRESETS]
    unknown = [o for o in options if o not in known]
    if unknown:
        return f"{name}: unknown option(s) {', '.join(unknown)}; expected some of {', '.join(known)}"
    if options and not (base.startswith("ours-") and base.endswith("-xla")):
        return f"{name}: options apply to ours-*-xla variants only"
    if "k8" in options and "whole" not in options:
        return f"{name}: k8 runs whole steps in one program: it needs +whole"
    return None


def xla_flags(name, flags=""):
    """XLA_FLAGS for a variant's process: `flags` (the environment's) and its presets' flags."""
    return " ".join([flags] + [XLA_PRESETS[o] for o in split_variant(name)[1] if o in XLA_PRESETS]).strip()


def variant_env(env, name, xla_cache_dir=None):
    """The environment of a variant's process: `env` with its XLA flag presets and, with xla_cache_dir,
    TensorFlow's persistent XLA cache (as bert_tf.training.xla_cache.enable) in a folder per preset set:
    the cache may not tell a program compiled under other XLA flags from this one (it checks the HLO)."""
    out = dict(env, XLA_FLAGS=xla_flags(name, env.get("XLA_FLAGS", "")))
    for option in split_variant(name)[1]:
        out.update(ENV_PRESETS.get(option, {}))
    if xla_cache_dir:
        presets = [o for o in split_variant(name)[1] if o in XLA_PRESETS]
        folder = os.path.join(os.path.abspath(xla_cache_dir), *(["+".join(presets)] if presets else []))
        out["TF_XLA_FLAGS"] = f"{env.get('TF_XLA_FLAGS', '')} --tf_xla_persistent_cache_directory={folder}".strip()
    return out


def bert_config(size, **overrides):
    """The BertConfig of a SIZES name (vocab VOCAB)."""
    from bert_tf.configs import BertConfig

    if size == "base4":
        return BertConfig.named("base", vocab_size=VOCAB, num_hidden_layers=SIZES[size][0], **overrides)
    return BertConfig.named(size, vocab_size=VOCAB, **overrides)
PEERS = ("tfm", "hf")  # variant prefixes of the peer implementations
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # variant name -> TrainSettings'
# The matmul peak's shape: `reps` independent products of [n, n] x [n, n], `calls` times per trial.
PROFILE_STEPS = 8  # steps of the profiled call (--profile): a few, so a GPU trace stays small; one +k8 program
PEAK_SHAPE = {"cpu": dict(n=1024, reps=8, calls=1), "gpu": dict(n=8192, reps=4, calls=10)}
TORCH_THREADS = 2
# Our "gelu" is the tanh approximation; transformers' "gelu_pytorch_tanh" is that function as one fused
# PyTorch op ("gelu_new" computes the same thing from elementwise ops).
HF_ACTIVATION = "gelu_pytorch_tanh"
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


def _batches(args):
    """The batches every variant trains on, in the same order.

    Synthetic: one batch per step of a host call; the untimed first call sees each of them, so the
    timed calls measure the steady state. (Ours compiles its fused kernels and oneDNN its matmuls
    once per padded row count; in a real run that happens for the first few dozen steps.)
    --input_file: real batches read once by the parent (`read_real_batches`), a new one every step,
    so the timed calls also pay for whatever a real run pays on batches it has not seen."""
    if args.batches_file:
        import numpy as np

        with np.load(args.batches_file) as stacked:
            return [{k: stacked[k][i] for k in stacked.files} for i in range(len(stacked["input_ids"]))]
    return synthetic_batches(args.batch, args.seq, args.preds, num=args.steps)


def read_real_batches(input_file, batch, num, out_path, packed_path=None):
    """The first `num` batches of pretraining TFRecords (file order, no shuffling), read through
    run_pretraining's own pipeline and saved stacked to `out_path` (.npz); returns their shape and padding.
    packed_path: also the first `num` batches of those records packed several to a row (run_pretraining
    --pack_sequences' pipeline, file order), saved there; the result then has their padding too."""
    import numpy as np

    from bert_tf.data import packing, pipelines, schema

    files = pipelines.expand_input_files(input_file)
    lengths = schema.inspect_record_file(files[0])
    seq, preds = lengths["max_seq_length"], lengths["max_predictions_per_seq"]
    for path in files[1:]:
        pipelines.check_record_lengths(path, seq, preds)
    dataset = pipelines.pretraining_dataset(files, seq, preds, batch, is_training=False)
    batches = [{k: v.numpy() for k, v in b.items()} for b in dataset.take(num)]
    if len(batches) < num:
        raise pipelines.InputDataError(
            f"{input_file}: {len(batches)} full batches of {batch}, the run needs {num} (--steps x (--loops + 1))")
    largest = max(int(b["input_ids"].max()) for b in batches)
    if largest >= VOCAB:
        raise pipelines.InputDataError(f"{input_file}: token id {largest} is outside the benchmark's vocab of {VOCAB}")
    packed = None
    if packed_path:
        rows = packing.packed_pretraining_dataset(files, seq, preds, batch, is_training=False)
        packed = [{k: v.numpy() for k, v in b.items()} for b in rows.take(num)]
        if len(packed) < num:
            raise pipelines.InputDataError(
                f"{input_file}: {len(packed)} batches of {batch} packed rows, the run needs {num} (--steps x (--loops + 1))")
    np.savez(out_path, **{k: np.stack([b[k] for b in batches]) for k in batches[0]})
    real = [int(b["input_mask"].sum()) for b in batches]
    info = dict(seq=seq, preds=preds, padding=1 - sum(real) / (num * batch * seq), distinct_rows=len(set(real)))
    if packed is not None:
        np.savez(packed_path, **{k: np.stack([b[k] for b in packed]) for k in packed[0]})
        info["packed_padding"] = 1 - sum(real_tokens(b) for b in packed) / (num * batch * seq)
    return info


def real_tokens(batch) -> int:
    """A batch's real (non-padding) tokens: nonzero input_mask, or sequence_ids of packed rows."""
    mask = batch["sequence_ids"] if "sequence_ids" in batch else batch["input_mask"]
    return int((mask != 0).sum())


def timed_real_tokens(batches, steps, loops) -> int:
    """Real tokens of the batches the timed calls train on: steps `steps` .. steps * (loops + 1) - 1,
    step i on batches[i % len(batches)] (every variant cycles through its batches that way)."""
    return sum(real_tokens(batches[i % len(batches)]) for i in range(steps, steps * (loops + 1)))


def compile_seconds(first_call: float, timed_calls) -> float:
    """What the first call paid beyond a steady call of as many steps (tracing, XLA or torch.compile
    compilation, autotuning): its seconds minus the mean of the timed calls'."""
    return max(first_call - sum(timed_calls) / len(timed_calls), 0.0)


def _rates(args, batches, seconds, first_call, timed_calls):
    """The figures every variant reports beside its own: real tokens/s and compile seconds."""
    return dict(real_tokens_per_s=timed_real_tokens(batches, args.steps, args.loops) / seconds,
                first_call_s=first_call, compile_s=compile_seconds(first_call, timed_calls))


# ---------------------------------------------------------------------------- devices
def gpu_name():
    """The first GPU `nvidia-smi` lists (with the count when there are several), None without one."""
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []
    if not names:
        return None
    return names[0] if len(names) == 1 else f"{len(names)}x {names[0]}"


def cpu_name() -> str:
    """'<cores>-core <model name>' from /proc/cpuinfo (the platform's processor string elsewhere)."""
    model = platform.processor() or "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()}-core {model}"


def tf_device(device) -> str:
    """The device TensorFlow runs on, by its own account; exits with one line when it has no GPU
    for a GPU run (its CUDA libraries did not load: it would silently train on the CPU)."""
    import tensorflow as tf

    if device != "gpu":
        return cpu_name()
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        sys.exit("TensorFlow sees no GPU (are its CUDA libraries on LD_LIBRARY_PATH?)")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")


def torch_device(device):
    """(torch device string, its name); exits with one line when PyTorch has no GPU for a GPU run."""
    import torch

    if device != "gpu":
        torch.set_num_threads(TORCH_THREADS)
        return "cpu", cpu_name()
    if not torch.cuda.is_available():
        sys.exit("PyTorch sees no CUDA device")
    return "cuda", torch.cuda.get_device_name(0)


def torch_sync(device: str) -> None:
    """Waits for the device's queued kernels (CUDA runs them asynchronously); nothing on the CPU."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


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


def profile_steps(args, per_program: int = 1) -> int:
    """Steps of the profiled host call after the timed ones (0: no profile), whole programs of `per_program`."""
    return -(-min(args.steps, PROFILE_STEPS) // per_program) * per_program if getattr(args, "profile_dir", None) else 0


def steps_per_program(options) -> int:
    """K of a variant's options (+k8: 8), 1 without."""
    return 8 if "k8" in options else 1


def run_ours(args, precision, xla, options=()):
    import shutil

    from bert_tf.models.encoder import BertEncoder
    from bert_tf.models.pretrainer import BertPretrainer
    from bert_tf.runners.pretraining import pretraining_loss_fn
    from bert_tf.training import loop
    from bert_tf.training import optimizer as optimizer_lib
    from bert_tf.training.memory import retain_freed_memory
    from bert_tf.training.settings import TrainSettings
    from bert_tf.training.strategy import get_strategy

    retain_freed_memory()  # as run_pretraining.py (bert_setup.make_strategy)
    k = steps_per_program(options)
    # Host calls of whole K-step programs: --steps rounded up to a multiple of K (the timed steps with it).
    args = argparse.Namespace(**dict(vars(args), steps=-(-args.steps // k) * k))
    device = tf_device(args.device)
    layers, hidden = SIZES[args.size]
    config = bert_config(args.size, **(dict(attention_probs_dropout_prob=0.0) if "adrop0" in options else {}))

    def model_fn():
        attention = "cudnn_btnh" if "btnh" in options else "cudnn" if "cudnn" in options else "xla"
        encoder = BertEncoder(config, attention_implementation=attention,
                              plain_epilogues="plain_epilogues" in options)
        return BertPretrainer(config, encoder=encoder, skip_padding=not xla)

    batches = _batches(args)
    with tempfile.TemporaryDirectory() as model_dir:
        timed_end = args.steps * (args.loops + 1)
        extra = profile_steps(args, k)  # profiled after the timed loops, in a host call of its own
        settings = TrainSettings(iterations_per_loop=args.steps, save_checkpoints_steps=10**9,
                                      mixed_precision=precision, jit_compile=xla,
                                      compile_whole_step="whole" in options,
                                      input_wait_clock="noclock" not in options,
                                      device_input="devfeed" in options or k > 1, steps_per_program=k,
                                      profile_steps=(timed_end + 1, timed_end + extra) if extra else None)
        trainer = loop.Trainer(
            get_strategy("one_device"), settings, model_fn, pretraining_loss_fn,
            lambda v: optimizer_lib.create_optimizer("adamw", v, 1e-4, 10000, 0), model_dir=model_dir,
            train_steps=timed_end + extra, global_batch_size=args.batch, checkpoint_input_pipeline=False)
        trainer.loop_history = _CpuStampedList()  # CPU time between loop records = the timed loops' CPU time
        # The final step saves a checkpoint after the last timed loop; it is not timed.
        cpu_before = time.process_time()
        trainer.train(lambda ctx, b: _dataset(batches))
        if extra:  # the trace, not the checkpoint (BERT-base's is GBs)
            shutil.copytree(os.path.join(model_dir, loop.TRAIN_DIR, "plugins"),
                            os.path.join(args.profile_dir, "plugins"), dirs_exist_ok=True)
    # A loop record's seconds end when the loop's step losses are on the host: synchronised with the device.
    # The first loop runs its first step alone (tracing, compiling: its compile_seconds) and the rest after.
    first = trainer.loop_history[0]
    first_call = first["seconds"] + first.get("compile_seconds", 0.0)
    timed = trainer.loop_history[1:args.loops + 1]
    seconds = sum(r["seconds"] for r in timed)
    steps = sum(r["steps"] for r in timed)
    losses = trainer.step_losses[args.steps:timed_end]
    cpu = trainer.loop_history.cpu_times[args.loops] - trainer.loop_history.cpu_times[0]
    return dict(seq_per_s=steps * args.batch / seconds, cpu_s_per_seq=cpu / (steps * args.batch),
                loss=sum(losses) / len(losses),
                first_loss=trainer.step_losses[0], params=loop.count_parameters(trainer.model),
                flops_per_seq=flops_per_sequence(layers, hidden, args.seq, args.preds), device=device,
                # The same in process CPU seconds: steadier than wall time on a loaded machine.
                compile_cpu_s=compile_seconds(trainer.loop_history.cpu_times[0] - cpu_before, [cpu / args.loops]),
                **_rates(args, batches, seconds, first_call, [r["seconds"] for r in timed]))


def tfm_pretrainer(size, bf16):
    """tf-models-official's BertPretrainerV2 at our shape (tanh GELU, NSP head), seeded; sets the
    tf_keras mixed_bfloat16 policy when bf16 (the caller restores it)."""
    import tf_keras
    from official.nlp.modeling import layers as tfm_layers
    from official.nlp.modeling import models, networks

    layers, hidden = SIZES[size]
    if bf16:
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    tf_keras.utils.set_random_seed(0)
    encoder = networks.BertEncoderV2(
        vocab_size=VOCAB, hidden_size=hidden, num_layers=layers, num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden, max_sequence_length=512, type_vocab_size=2,
        inner_activation=lambda x: tf_keras.activations.gelu(x, approximate=True))
    return models.BertPretrainerV2(
        encoder_network=encoder,
        classification_heads=[tfm_layers.ClassificationHead(inner_dim=hidden, num_classes=2, name="next_sentence")])


def tfm_loss(model, batch):
    """The original's pretraining loss for a BertPretrainerV2 on our feature names (training mode)."""
    import tensorflow as tf

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


def run_tfm(args, precision, xla):
    import tensorflow as tf
    import tf_keras

    device = tf_device(args.device)
    layers, hidden = SIZES[args.size]
    model = tfm_pretrainer(args.size, precision != "float32")
    optimizer = tf_keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0)
    batches = _batches(args)
    iterator = iter(_dataset(batches))

    def loss_fn(batch):
        return tfm_loss(model, batch)

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
    start = time.time()
    first = train_loop(n).numpy()
    first_call, calls, losses = time.time() - start, [], []
    cpu_start = time.process_time()
    for _ in range(args.loops):
        start = time.time()
        losses.extend(train_loop(n).numpy().tolist())  # .numpy(): waits for the device
        calls.append(time.time() - start)
    seconds = sum(calls)
    sequences = args.loops * args.steps * args.batch
    return dict(seq_per_s=sequences / seconds, cpu_s_per_seq=(time.process_time() - cpu_start) / sequences,
                loss=sum(losses) / len(losses),
                first_loss=float(first[0]), params=int(sum(tf.size(v) for v in model.trainable_variables)),
                flops_per_seq=flops_per_sequence(layers, hidden, args.seq, args.preds), device=device,
                **_rates(args, batches, seconds, first_call, calls))


def run_hf(args, bf16, compile_):
    """Hugging Face BertForPreTraining in PyTorch, MLM head applied only at the masked positions."""
    import torch
    import transformers

    device, device_name = torch_device(args.device)
    torch.manual_seed(0)
    layers, hidden = SIZES[args.size]
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden, max_position_embeddings=512, type_vocab_size=2, hidden_act=HF_ACTIVATION,
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, attn_implementation="sdpa")
    model = transformers.BertForPreTraining(config).to(device).train()
    params = list(model.parameters())  # tied decoder weight / bias appear once
    # Decay exclusions of the original (and of transformers' Trainer): biases and LayerNorm.
    no_decay = {id(p) for name, p in model.named_parameters() if "bias" in name or "LayerNorm" in name}
    optimizer = torch.optim.AdamW(
        [dict(params=[p for p in params if id(p) not in no_decay], weight_decay=0.01),
         dict(params=[p for p in params if id(p) in no_decay], weight_decay=0.0)],
        lr=1e-4, eps=1e-6, fused=True)  # fused: fastest of fused/foreach on this CPU, one kernel set on CUDA
    host_batches = _batches(args)
    batches = [{k: (torch.from_numpy(v).long() if v.dtype.kind == "i" else torch.from_numpy(v)).to(device)
                for k, v in b.items()} for b in host_batches]  # on the device before the first step

    def loss_fn(batch):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            sequence_output, pooled = model.bert(
                input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
                token_type_ids=batch["segment_ids"], return_dict=False)[:2]
            positions = batch["masked_lm_positions"]
            index = positions.unsqueeze(-1).expand(-1, -1, sequence_output.shape[-1])
            gathered = torch.gather(sequence_output, 1, index).reshape(-1, sequence_output.shape[-1])
            mlm_logits = model.cls.predictions(gathered)
            nsp_logits = model.cls.seq_relationship(pooled)
        mlm = torch.nn.functional.cross_entropy(mlm_logits.float(), batch["masked_lm_ids"].reshape(-1),
                                                reduction="none")
        w = batch["masked_lm_weights"].reshape(-1)
        mlm = (mlm * w).sum() / (w.sum() + 1e-5)
        nsp = torch.nn.functional.cross_entropy(nsp_logits.float(), batch["next_sentence_labels"][:, 0])
        return mlm + nsp

    if compile_:  # forward + loss as one graph (AOTAutograd compiles the backward too); update stays fused
        loss_fn = torch.compile(loss_fn)

    def step(batch):
        loss = loss_fn(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def train_loop(n, start):
        losses = torch.stack([step(batches[(start + i) % len(batches)]) for i in range(n)])
        torch_sync(device)
        return losses.tolist()

    torch_sync(device)
    start = time.time()
    first = train_loop(args.steps, 0)  # warm-up; compilation happens here
    first_call, calls, losses = time.time() - start, [], []
    cpu_start = time.process_time()
    for loop_index in range(args.loops):
        start = time.time()
        losses.extend(train_loop(args.steps, (loop_index + 1) * args.steps))
        calls.append(time.time() - start)
    seconds = sum(calls)
    sequences = args.loops * args.steps * args.batch
    cpu_seconds = time.process_time() - cpu_start
    if profile_steps(args):
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
        with torch.profiler.profile(activities=activities) as profiler:
            train_loop(profile_steps(args), (args.loops + 1) * args.steps)
        save_chrome_trace(profiler, args.profile_dir)
    return dict(seq_per_s=sequences / seconds, cpu_s_per_seq=cpu_seconds / sequences,
                loss=sum(losses) / len(losses), first_loss=first[0], params=sum(p.numel() for p in params),
                flops_per_seq=flops_per_sequence(layers, hidden, args.seq, args.preds), device=device_name,
                **_rates(args, host_batches, seconds, first_call, calls))


def save_chrome_trace(profiler, folder) -> str:
    """torch.profiler's Chrome trace, gzipped, as <folder>/trace.json.gz (a GPU step's is tens of MB raw)."""
    import gzip
    import shutil

    os.makedirs(folder, exist_ok=True)
    raw, path = os.path.join(folder, "trace.json"), os.path.join(folder, "trace.json.gz")
    profiler.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)
    return path


def matmul_peak(dtype_name, device="cpu", trials=3):
    """FLOP/s of `reps` independent [n, n] x [n, n] products (distinct operands in every one: nothing
    to fold or reuse) in graph mode, `calls` calls per trial, best trial (the practical peak)."""
    import tensorflow as tf

    n, reps, calls = (PEAK_SHAPE[device][k] for k in ("n", "reps", "calls"))
    dtype = {"fp32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}[dtype_name]
    a = tf.cast(tf.random.normal((reps, n, n)), dtype)
    b = tf.cast(tf.random.normal((reps, n, n)), dtype)

    @tf.function
    def mm(x, y):
        return tf.matmul(x, y)

    def timed():
        start = time.time()
        for _ in range(calls):
            out = mm(a, b)
        out[0, 0, 0].numpy()  # waits for the device: its kernels run in order
        return time.time() - start

    timed()
    return 2 * n**3 * reps * calls / min(timed() for _ in range(trials))


def torch_matmul_peak(dtype_name, device="cpu", trials=3):
    """The same measurement in PyTorch (its own BLAS / oneDNN or cuBLAS kernels), for the hf-* variants."""
    import torch

    where, _ = torch_device(device)
    n, reps, calls = (PEAK_SHAPE[device][k] for k in ("n", "reps", "calls"))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    a = torch.randn(reps, n, n, device=where).to(dtype)
    b = torch.randn(reps, n, n, device=where).to(dtype)

    def timed():
        torch_sync(where)
        start = time.time()
        for _ in range(calls):
            out = torch.bmm(a, b)
        torch_sync(where)
        out[0, 0, 0].item()
        return time.time() - start

    with torch.no_grad():
        timed()
        best = min(timed() for _ in range(trials))
    return 2 * n**3 * reps * calls / best


def worker(args):
    base, options = split_variant(args.worker)
    impl, precision, mode = base.split("-")
    if impl == "read":
        try:
            real = read_real_batches(args.input_file, args.batch, args.steps * (args.loops + 1), args.batches_file,
                                     args.packed_file)
        except ValueError as e:  # InputDataError and the schema's errors name the file
            sys.exit(str(e).splitlines()[0])
        print("RESULT" + json.dumps(real))
        return
    if impl == "torchpeak":  # no TensorFlow in the PyTorch processes
        print("RESULT" + json.dumps(dict(flops=torch_matmul_peak(precision, args.device), device=torch_device(args.device)[1])))
        return
    if impl == "hf":
        print("RESULT" + json.dumps(run_hf(args, precision == "bf16", mode == "compile")))
        return
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    if impl == "peak":
        print("RESULT" + json.dumps(dict(flops=matmul_peak(precision, args.device), device=tf_device(args.device))))
        return
    precision = PRECISIONS[precision]
    if impl == "ours":
        print("RESULT" + json.dumps(run_ours(args, precision, mode == "xla", options)))
        return
    print("RESULT" + json.dumps(run_tfm(args, precision, mode == "xla")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--preds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=3, help="steps per host call (timed calls: --loops)")
    parser.add_argument("--loops", type=int, default=2)
    parser.add_argument("--variants", default=None,
                        help="comma-separated; default: VARIANTS on a CPU, GPU_VARIANTS on a GPU")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the variant list this many times, interleaved, and keep each variant's best")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto: the GPU when nvidia-smi lists one; cpu hides any GPU from the variants")
    parser.add_argument("--inter_op_threads", type=int, default=None,
                        help="TensorFlow inter-op threads in every variant (default 1 on a CPU, where it ran "
                             "~1.5x faster on 2 cores; TensorFlow's own choice on a GPU)")
    parser.add_argument("--input_file", default=None,
                        help="pretraining TFRecords (comma-separated globs, as run_pretraining.py): every variant "
                             "trains on their first batches, a new one each step; --seq and --preds come from the data")
    parser.add_argument("--pack_sequences", action="store_true",
                        help="with --input_file: ours trains on the records packed several to a row, the peers "
                             "on them padded")
    parser.add_argument("--out_dir", default=os.environ.get("OUT") or None,
                        help="write results.json and report.txt here (default: $OUT when set)")
    parser.add_argument("--xla_cache_dir", default=None,
                        help="TensorFlow's persistent XLA compilation cache for every variant (run_pretraining "
                             "--xla_cache_dir): with --rounds=2 the second round's compile s is what a repeated run pays")
    parser.add_argument("--no_peaks", action="store_true",
                        help="skip the matmul peaks (no MFU column): an A/B of variants that only compares them")
    parser.add_argument("--profile", action="store_true",
                        help="with --out_dir: profile a few steps of each ours-*/hf-* variant after its timed ones "
                             "and add their breakdown by kernel class to the report")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batches_file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--packed_file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile_dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.pack_sequences and not args.input_file:
        parser.error("--pack_sequences needs --input_file (records to pack)")
    if args.profile and not args.out_dir:
        parser.error("--profile needs --out_dir (or $OUT) for the traces")
    name = gpu_name() if args.device != "cpu" else None
    if args.device == "gpu" and name is None:
        parser.error("--device=gpu: nvidia-smi lists no GPU")
    args.device = "gpu" if name else "cpu"
    args.device_name = name or cpu_name()
    if args.inter_op_threads is None:
        args.inter_op_threads = 1 if args.device == "cpu" else 0  # 0: TensorFlow's default
    names = list(dict.fromkeys((args.variants or ",".join(
        GPU_VARIANTS if args.device == "gpu" else VARIANTS)).split(",")))
    errors = [e for e in map(variant_error, names) if e]
    if errors:
        parser.error(f"{'; '.join(errors)}; variants are some of {', '.join(KNOWN_VARIANTS)}, ours-*-xla with "
                     f"+options (benchmarks/bench_pretraining.py MODEL_OPTIONS, XLA_PRESETS)")

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run on a GPU machine: neither framework sees the GPU
    keys = ("size", "batch", "seq", "preds", "steps", "loops", "inter_op_threads", "input_file", "device")
    failures = {}

    def run(name, fatal=False):
        files = dict(batches_file=args.batches_file, packed_file=args.packed_file)
        if args.pack_sequences and name.startswith("ours"):
            files["batches_file"] = args.packed_file  # ours trains on the packed rows
        if not name.startswith("read"):
            files.pop("packed_file")
        if args.profile and name.split("-")[0] in ("ours", "hf"):
            files["profile_dir"] = profile_dir(args, name)
        command = [sys.executable, os.path.abspath(__file__), f"--worker={name}"] + [
            f"--{k}={v}" for k, v in [(k, getattr(args, k)) for k in keys] + list(files.items()) if v is not None]
        proc = subprocess.run(command, capture_output=True, text=True, env=variant_env(env, name, args.xla_cache_dir))
        if proc.returncode != 0 or "RESULT" not in proc.stdout:
            if fatal:  # the worker's last line is its one-line error
                sys.exit(f"{name}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
            print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            failures.setdefault(name, proc.stderr[-4000:])
            progress(args, dict(variant=name, failed=failure_line(proc.stderr)))
            return None
        return json.loads(proc.stdout.split("RESULT", 1)[1])

    with tempfile.TemporaryDirectory() as tmp:
        data = f"synthetic, {PAD_FRACTION:.0%} padding on average"
        if args.input_file:
            args.batches_file = os.path.join(tmp, "batches.npz")
            args.packed_file = os.path.join(tmp, "packed.npz") if args.pack_sequences else None
            real = run("read-x-x", fatal=True)
            args.seq, args.preds = real["seq"], real["preds"]
            data = (f"{args.input_file}: {args.steps * (args.loops + 1)} batches in file order, {real['padding']:.0%} "
                    f"padding, {real['distinct_rows']} distinct real-token counts")
            if args.pack_sequences:
                data += f"; ours on packed rows of the same records, {real['packed_padding']:.0%} padding"
        lines, record = report(args, names, run)
        lines.append(f"data: {data}")
        print(lines[-1])
        lines.append(f"fed: {feeding(names, args.device)}")
        print(lines[-1])
        if args.profile:
            lines += profile_report(args, names, record, env)
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        record.update(data=data, failures=failures)
        with open(os.path.join(args.out_dir, "results.json"), "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        with open(os.path.join(args.out_dir, "report.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


def feeding(names, device) -> str:
    """How each side of the run gets its batches onto the device, for the report (a level comparison
    feeds both the same way; the figures say which way each was fed)."""
    if device == "cpu":
        return "every variant from host memory (the CPU is the device)"
    parts = []
    ours = [n for n in names if n.startswith("ours-")]
    fed = [n for n in ours if {"devfeed", "k8"} & set(split_variant(n)[1])]
    if len(fed) < len(ours):
        parts.append("ours from a cached tf.data dataset in host memory, each step's batch copied to the GPU "
                     "by the step's call")
    if fed:
        parts.append("ours+devfeed prefetched onto the GPU by tf.distribute (experimental_fetch_to_device)"
                     + (", +k8 stacked 8 steps to an element" if any("k8" in split_variant(n)[1] for n in fed) else ""))
    if any(n.startswith("tfm-") for n in names):
        parts.append("tfm from a cached tf.data dataset in host memory")
    if any(n.startswith("hf-") for n in names):
        parts.append("hf with every batch moved to the GPU once, before the first step")
    return "; ".join(parts)


def failure_line(stderr: str) -> str:
    """The line of a failed worker's stderr that says why: the last one that is not a traceback's
    indented context or TensorFlow's op-name trailer."""
    lines = [line for line in stderr.strip().splitlines() if line.strip() and not line[0].isspace()]
    return (lines or ["failed"])[-1]


def progress(args, record) -> None:
    """Appends one variant's result (or failure) to <out_dir>/progress.jsonl as soon as it is measured, so
    a run cut short (a GPU session's time running out) still leaves what it measured."""
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "progress.jsonl"), "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


def profile_dir(args, name) -> str:
    return os.path.join(args.out_dir, "profile", name)


def profile_report(args, names, record, env):
    """The profiled variants' traces by kernel class, side by side (benchmarks/trace_summary.py, run in a
    process of its own); the summaries go into `record` too. Returns the printed lines."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    folders = [profile_dir(args, n) for n in names if os.path.isdir(profile_dir(args, n))]
    if not folders:
        return []
    steps = min(args.steps, PROFILE_STEPS)
    proc = subprocess.run([sys.executable, os.path.join(here, "trace_summary.py"), *folders, f"--steps={steps}",
                           "--json"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        line = f"profile summary failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
        print(line)
        return [line]
    summaries = json.loads(proc.stdout)
    record["profiles"] = dict(zip([os.path.basename(f) for f in folders], summaries, strict=True))
    spec = importlib.util.spec_from_file_location("trace_summary", os.path.join(here, "trace_summary.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (f"\nwhere the time goes, {args.device_name}, per step of {steps} profiled "
            f"({', '.join(os.path.basename(f) for f in folders)}):\n" + module.format_summaries(summaries))
    print(text)
    return text.splitlines()


def peak_names(args, names):
    """The matmul peaks a run measures: TensorFlow's for ours/tfm, PyTorch's when hf-* runs, each in bf16,
    in its variants' precisions, and in fp32 on a CPU (its historical baseline)."""
    out = []
    if getattr(args, "no_peaks", False):
        return out
    for lib, impls in (("peak", ("ours", "tfm")), ("torchpeak", ("hf",))):
        mine = {n.split("-")[1] for n in names if n.split("-")[0] in impls}
        if mine:
            wanted = mine | {"bf16"} | ({"fp32"} if args.device == "cpu" else set())
            out += [f"{lib}-{p}" for p in ("fp32", "bf16", "fp16") if p in wanted]
    return out


def hardware_peak(peaks, precision):
    """The device's practical matmul peak in `precision`: the best of the libraries' measurements."""
    found = [v["flops"] for k, v in peaks.items() if v and k.endswith(f"-{precision}")]
    return max(found) if found else None


def report(args, names, run):
    """Runs the matmul peaks and the variants (interleaved rounds); prints the comparison and returns
    (its lines, everything measured as one JSON-able record)."""
    lines = []

    def say(line=""):
        print(line)
        lines.append(line)

    load_before = os.getloadavg()
    started = time.time()
    peaks = {p: run(f"{p}-x") for p in peak_names(args, names)}  # matmul peaks: TensorFlow, PyTorch if hf-* runs
    by_round = [{} for _ in range(args.rounds)]  # round -> {variant: result}, rounds interleaved
    for r in range(args.rounds):
        for name in names:
            result = run(name)
            if result:
                by_round[r][name] = result
                progress(args, dict(variant=name, round=r + 1, **result))
                print(f"round {r + 1} {name:18s} {result['seq_per_s']:7.2f} seq/s "
                      f"{result['cpu_s_per_seq']:6.3f} CPU-s/seq compile {result['compile_s']:6.1f} s "
                      f"({result.get('compile_cpu_s', float('nan')):.1f} CPU-s) "
                      f"load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    rounds = {name: [rr[name] for rr in by_round if name in rr] for name in names}  # a variant's results
    # Best round per variant: the highest wall-clock rate, and the least CPU time per sequence
    # (steadier than wall time on a shared machine: it does not count time spent waiting for a core).
    results = {}
    for name, rs in rounds.items():
        if rs:
            results[name] = dict(max(rs, key=lambda r: r["seq_per_s"]),
                                 cpu_s_per_seq=min(r["cpu_s_per_seq"] for r in rs),
                                 compile_s=min(r["compile_s"] for r in rs))

    say(f"\n{args.device_name}: BERT-{args.size}, batch {args.batch}, seq {args.seq}, {args.preds} masked positions, "
        f"{args.loops}x{args.steps} timed steps per variant, best of {args.rounds} interleaved round(s), "
        f"inter-op threads {args.inter_op_threads or 'default'} (TensorFlow)"
        + (f", {TORCH_THREADS} threads (PyTorch)" if args.device == "cpu" else ""))
    say(f"matmul peak ({args.device_name}, distinct operands per product): " + ", ".join(
        f"{'TensorFlow' if lib == 'peak' else 'PyTorch'} {p} " + (
            f"{peaks[f'{lib}-{p}']['flops'] / 1e12:.3f} TFLOP/s" if peaks[f"{lib}-{p}"] else "n/a")
        for lib, p in (k.split("-") for k in peaks)))
    ok = results
    peer = {k: v for k, v in ok.items() if k.split("-")[0] in PEERS}
    best_peer_name = max(peer, key=lambda k: peer[k]["seq_per_s"], default=None)
    best_peer = peer[best_peer_name]["seq_per_s"] if peer else None
    least_peer_cpu = min((v["cpu_s_per_seq"] for v in peer.values()), default=None)
    width = max([18] + [len(n) for n in ok])  # a variant with + options is longer
    say(f"{'variant':{width}s} {'seq/s':>8s} {'vs best peer':>12s} {'CPU-s/seq':>9s} {'vs peer':>7s} {'MFU':>6s} "
        f"{'real tok/s':>10s} {'compile s':>9s} {'loss':>8s} {'params':>11s}  device")
    for name, r in ok.items():
        precision = name.split("-")[1]
        peak = hardware_peak(peaks, precision)
        r["mfu"] = r["seq_per_s"] * r["flops_per_seq"] / peak if peak else None
        ratio = f"{r['seq_per_s'] / best_peer:11.2f}x" if best_peer else f"{'-':>12s}"  # no peer in the run
        cpu_ratio = f"{least_peer_cpu / r['cpu_s_per_seq']:6.2f}x" if least_peer_cpu else f"{'-':>7s}"
        mfu = f"{100 * r['mfu']:5.1f}%" if r["mfu"] is not None else "   n/a"
        say(f"{name:{width}s} {r['seq_per_s']:8.2f} {ratio} {r['cpu_s_per_seq']:9.2g} {cpu_ratio} "
            f"{mfu} {r['real_tokens_per_s']:10.0f} {r['compile_s']:9.1f} {r['loss']:8.4f} {r['params']:11,d}  "
            f"{r['device']}")
    ours = {k: v for k, v in ok.items() if k.startswith("ours")}
    if ours and peer:
        best_ours_name = max(ours, key=lambda k: ours[k]["seq_per_s"])
        least_ours_cpu = min(v["cpu_s_per_seq"] for v in ours.values())
        best_tokens = max(ours.values(), key=lambda v: v["real_tokens_per_s"])["real_tokens_per_s"]
        peer_tokens = max(v["real_tokens_per_s"] for v in peer.values())
        say(f"best ours / best peer ({best_ours_name} / {best_peer_name}, {args.device_name}): "
            f"{ours[best_ours_name]['seq_per_s'] / best_peer:.2f}x wall-clock, "
            f"{least_peer_cpu / least_ours_cpu:.2f}x by CPU time per sequence, "
            f"{best_tokens / peer_tokens:.2f}x real tokens/s")
    # The same ratio within each round (ours and the peers ran minutes apart, not hours): the
    # machine's speed drifts 10-30% over a run here, and best-of-rounds can pair one variant's
    # fast round with another's slow one. The median over rounds is the steadier figure.
    paired = []
    for here in by_round:
        ours_r = [v["seq_per_s"] for k, v in here.items() if k.startswith("ours")]
        peer_r = [v["seq_per_s"] for k, v in here.items() if k.split("-")[0] in PEERS]
        if ours_r and peer_r:
            paired.append(max(ours_r) / max(peer_r))
    if paired:
        say(f"best ours / best peer within each round: {', '.join(f'{x:.2f}x' for x in paired)}; "
            f"median {statistics.median(paired):.2f}x")
    # Same-round ratios of each ours variant to its tfm counterpart (same precision and mode).
    for name in names:
        tfm = "tfm" + name[len("ours"):]
        pairs = [(rr[name], rr[tfm]) for rr in by_round if name in rr and tfm in rr]  # rounds both finished
        if name.startswith("ours") and pairs:
            say(f"{name} / {tfm} per round: " + ", ".join(
                f"{a['seq_per_s'] / b['seq_per_s']:.2f}x wall {b['cpu_s_per_seq'] / a['cpu_s_per_seq']:.2f}x CPU"
                for a, b in pairs))
    say(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
        f"({os.cpu_count()} CPUs); took {time.time() - started:.0f}s")
    settings = {k: v for k, v in vars(args).items() if k not in ("worker", "batches_file", "packed_file")}
    return lines, dict(settings=settings, peaks=peaks, rounds=by_round, best=results)


if __name__ == "__main__":
    main()
