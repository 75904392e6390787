"""Fine-tuning throughput on a GLUE-like length mix: bert_tf with and without length bucketing vs tf-models-official.

Training examples/s of full fine-tuning steps (forward, backward, global-norm
clipping, AdamW update) of a sentence(-pair) classifier, side by side in one run:

  ours-bucket   bert_tf's run_classifier path (RunSettings -> make_trainer -> Trainer,
                classification_loss, arrays_dataset_fn) with dynamic padding and
                length bucketing (the CPU/GPU default of run_classifier.py)
  ours-dynamic  dynamic padding (each batch cut to its longest example), no bucketing
  ours-fixed    every batch padded to max_seq_length (--dynamic_padding=false, as on TPU)
  ours-lengths  batches cut to the few lengths bert_tf.runners.shapes chooses from the data (the
                default under XLA: use with -xla, e.g. ours-lengths-fp32-xla)
  tfm-fixed     tf-models-official 2.20: SentencePredictionTask.build_model() (BertClassifier
                over networks.BertEncoder, tf_keras), the optimizer of its
                'bert/sentence_prediction' experiment (AdamWeightDecay, weight decay 0.01,
                clip norm 1.0, polynomial decay + warmup) and its Task.train_step in a
                tf.range loop, as its orbit trainer runs it; fixed padding (its data
                loader's fixed seq_length)

A variant name is <impl>-<padding>-<precision>[-xla][-interop0]: precision fp32 or bf16
(Keras mixed_bfloat16 / tf_keras mixed_bfloat16), -xla compiles the step with XLA,
-interop0 keeps TensorFlow's default inter-op thread pool instead of --inter_op_threads.

The length mix: every labeled and test row of the real GLUE samples in
../shared/fixtures/glue (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE), tokenized with
the real uncased vocab and truncated to max_seq_length as run_classifier.py does, then
resampled to --examples examples (a task uniformly, then one of its rows). Without
../shared: a log-normal length distribution (median SYNTHETIC_MEDIAN tokens, sigma
SYNTHETIC_SIGMA, clipped to [3, max_seq_length]) with random ids. Random weights, random
binary labels.

Every variant runs in its own subprocess (fresh TensorFlow, dtype policy and thread
pools). The workers start one after another (import, build, trace, --warmup_steps untimed
steps) and then wait; in each of --rounds rounds every worker in turn (order rotated per
round) trains one round of steps while the others sleep, so slow drifts of the machine's
load hit all variants alike. A round is --steps steps at fixed padding and proportionally
more for variants whose batches are shorter (about the same tokens per round, so a
bucketed run samples its whole length mix). One host call per step (our Trainer with
iterations_per_loop=1; at seconds per step the call overhead is noise). Each step records
its wall time and the CPU time of its worker; the table gives medians over rounds of
examples/s and examples per CPU-second (the steadier number on a shared machine), the
1-minute load average during the runs and the share of the CPUs the worker got, and a
least-squares fit of CPU seconds per step = fixed + per-token cost over our steps.

  python benchmarks/bench_finetuning.py                          # default set, BERT-small
  python benchmarks/bench_finetuning.py --size=base --batch=16 --rounds=1 --steps=2
  python benchmarks/bench_finetuning.py --variants=all --rounds=1  # precision, XLA, thread pools too

Each worker holds ~2-3 GB at BERT-small; at most --max_workers are alive at once (larger
variant sets run in groups, interleaved within a group).

GPU mode (--gpu; the notes above "GPU mode" below say what each variant is): BERT-base, bf16,
batch 32, classification on the GLUE-like mix at seq 128 and SQuAD-like span training at 384,
ours (XLA: default shapes, packed, padded) against Hugging Face's Trainer recipe (eager and
torch.compile), examples/s after warm-up with compile seconds apart, the GPU's name beside
every figure; bench_finetuning_gpu.json and .md go to --output_dir (default $OUT). Needs
TensorFlow, torch and transformers; run it from the repository root:

  PYTHONPATH=$PWD python benchmarks/bench_finetuning.py --gpu --tasks=glue     # then --tasks=squad
  python benchmarks/bench_finetuning.py --gpu --tiny --examples=256 --batch=8 --warmup_steps=4 --steps=2  # CPU check
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")
GLUE_DIR = os.path.join(SHARED, "fixtures", "glue")
VOCAB_FILE = os.path.join(SHARED, "fixtures", "vocab", "bert-base-uncased-vocab.txt")
GLUE_TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE")
# Fallback length distribution without ../shared: log-normal, median near a sentence-pair
# GLUE mix (the real samples above pool to a median of ~30 tokens; SST-2 alone is ~11).
SYNTHETIC_MEDIAN = 30
SYNTHETIC_SIGMA = 0.6
VOCAB_SIZE = 30522
MIX_SAMPLE_BATCHES = 256  # batches of a pipeline read to find a padding mode's mean padded length
NUM_LABELS = 2
LEARNING_RATE = 2e-5
WARMUP_PROPORTION = 0.1

# float32 by default: at BERT-small on this 2-core CPU bfloat16 was slower for both implementations.
DEFAULT_VARIANTS = ("ours-bucket-fp32", "ours-dynamic-fp32", "ours-fixed-fp32", "tfm-fixed-fp32")
ALL_VARIANTS = DEFAULT_VARIANTS + (
    "ours-bucket-bf16", "ours-fixed-bf16", "tfm-fixed-bf16", "tfm-fixed-fp32-xla",
    "ours-bucket-fp32-interop0", "tfm-fixed-fp32-interop0")


# ---------------------------------------------------------------------------- data
def glue_features(max_seq_length):
    """{task: (input_ids, segment_ids) lists} of every row of the GLUE samples, as run_classifier featurizes them."""
    from bert_tf.tasks import glue
    from bert_tf.tokenization import FastTokenizer

    tokenizer = FastTokenizer(VOCAB_FILE, do_lower_case=True)
    out = {}
    for name in GLUE_TASKS:
        spec = glue.get_task(name.lower())
        examples = []
        for split in spec.splits:
            if os.path.exists(os.path.join(GLUE_DIR, name, split.filename)):
                examples += spec.read_examples(os.path.join(GLUE_DIR, name), split.name)
        # Labels do not matter here (the benchmark draws its own); lengths and ids do.
        stripped = [glue.InputExample(e.guid, e.text_a, e.text_b) for e in examples]
        features = glue.convert_examples_to_features(stripped, ("0",), max_seq_length, tokenizer)
        out[name] = [(f.input_ids, f.segment_ids) for f in features]
    return out


def build_arrays(num_examples, max_seq_length, seed=0):
    """Feature arrays in the original's names, [N, S] zero-padded, plus a description of the mix."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = np.zeros((num_examples, max_seq_length), np.int32)
    segments = np.zeros_like(ids)
    if os.path.isdir(GLUE_DIR) and os.path.exists(VOCAB_FILE):
        pools = glue_features(max_seq_length)
        names = sorted(pools)
        tasks = rng.integers(0, len(names), size=num_examples)
        for i, t in enumerate(tasks):
            pool = pools[names[t]]
            input_ids, segment_ids = pool[rng.integers(0, len(pool))]
            ids[i, :len(input_ids)] = input_ids
            segments[i, :len(segment_ids)] = segment_ids
        source = (f"real GLUE samples ({sum(len(p) for p in pools.values())} rows of {', '.join(names)}), "
                  f"resampled task-uniformly")
    else:
        lengths = np.clip(np.round(rng.lognormal(np.log(SYNTHETIC_MEDIAN), SYNTHETIC_SIGMA, num_examples)),
                          3, max_seq_length).astype(int)
        for i, n in enumerate(lengths):
            ids[i, :n] = rng.integers(1000, VOCAB_SIZE, size=n)
            ids[i, 0], ids[i, n - 1] = 101, 102  # [CLS] ... [SEP]
        source = f"synthetic log-normal lengths (median {SYNTHETIC_MEDIAN}, sigma {SYNTHETIC_SIGMA}; no ../shared)"
    mask = (ids != 0).astype(np.int32)
    lengths = mask.sum(1)
    arrays = dict(input_ids=ids, input_mask=mask, segment_ids=segments,
                  label_ids=rng.integers(0, NUM_LABELS, size=num_examples).astype(np.int32),
                  is_real_example=np.ones(num_examples, np.int32))
    info = dict(source=source, examples=num_examples, mean_length=float(lengths.mean()),
                median_length=float(np.median(lengths)), p90_length=float(np.percentile(lengths, 90)),
                max_length=int(lengths.max()))
    return arrays, info


def load_arrays(path):
    import numpy as np

    with np.load(path) as data:
        return {k: data[k] for k in data.files}


# ---------------------------------------------------------------------------- workers
# A worker builds its variant, runs --warmup_steps untimed steps, prints READY and then
# serves "run N" lines from stdin: N timed steps, one host call each (at seconds per
# step on a CPU the per-call overhead is noise), answered with one RESULT line holding a
# record per step: padded tokens (batch x padded length), real tokens, wall seconds of the
# step's host call and CPU seconds of the worker process (all its threads) for it.


def serve(run_steps, warmup_steps, steps_per_round, info):
    """The worker's side of the protocol; run_steps(n) -> dict(steps=[...], losses=[...], load=[...])."""
    run_steps(warmup_steps)
    print("READY" + json.dumps(dict(info, steps_per_round=steps_per_round)), flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[:1] == ["run"]:
            print("RESULT" + json.dumps(run_steps(steps_per_round)), flush=True)
        elif command[:1] == ["quit"]:
            return


def steps_per_round(args, mean_padded_length):
    """--steps at max_seq_length; proportionally more for shorter batches (about the same tokens per
    round), so a bucketed run samples many batches of its length mix, not two or three."""
    return max(args.steps, math.ceil(args.steps * args.max_seq_length / mean_padded_length))


def run_ours(args, padding, precision, xla):
    """Our run_classifier training path: RunSettings -> make_trainer -> Trainer.train(arrays_dataset_fn)."""
    import tensorflow as tf

    from bert_tf.configs import BertConfig
    from bert_tf.models import BertClassifier, BertEncoder
    from bert_tf.pretrained import Pretrained
    from bert_tf.runners import shapes
    from bert_tf.runners.arrays import arrays_dataset_fn
    from bert_tf.runners.classifier import classification_loss
    from bert_tf.runners.common import make_trainer
    from bert_tf.runners.settings import RunSettings
    from bert_tf.training.loop import count_parameters
    from bert_tf.training.memory import retain_freed_memory
    from bert_tf.training.settings import TrainSettings
    from bert_tf.training.strategy import get_strategy

    retain_freed_memory()  # as run_classifier.py (bert_setup.make_strategy)
    config = BertConfig.named(args.size, vocab_size=VOCAB_SIZE)
    arrays = load_arrays(args.data)
    dynamic = padding in ("bucket", "dynamic")
    settings = RunSettings(
        pretrained=Pretrained(config=config, vocab_file=VOCAB_FILE, init_checkpoint=None, fmt=None,
                              do_lower_case=True),
        strategy=get_strategy("one_device"), dynamic_padding=dynamic,
        train=TrainSettings(learning_rate=LEARNING_RATE, mixed_precision=precision, jit_compile=xla,
                            iterations_per_loop=1, save_checkpoints_steps=10**9))
    chosen = None
    if padding == "lengths":
        chosen = shapes.choose_lengths(shapes.example_lengths(arrays["input_mask"]), args.max_seq_length)
    dataset_fn = arrays_dataset_fn(arrays, training=True, seed=settings.train.seed, dynamic_padding=dynamic,
                                   bucket_by_length=padding == "bucket", lengths=chosen)
    sample = _batch_tokens(dataset_fn(tf.distribute.InputContext(), args.batch), MIX_SAMPLE_BATCHES)
    mix_padded = sum(p for p, _ in sample) / len(sample) / args.batch
    per_round = steps_per_round(args, mix_padded)
    total = args.warmup_steps + args.rounds * per_round
    clock = _Clock()
    training_logger = logging.getLogger("bert_tf.training")
    training_logger.addHandler(_StepLogHandler(clock))
    training_logger.setLevel(logging.INFO)
    output_dir = tempfile.mkdtemp(prefix="bench_finetuning_")
    trainer = make_trainer(settings, output_dir, lambda: BertClassifier(BertEncoder(config), NUM_LABELS, skip_padding=not xla),
                           classification_loss, num_train_steps=total, global_batch_size=args.batch,
                           warmup_proportion=WARMUP_PROPORTION)
    # The batches the run will see, in order: a pipeline with the same seeds (make_trainer has
    # set the global one) yields the same batches.
    tokens = _batch_tokens(dataset_fn(tf.distribute.InputContext(), args.batch), total)

    def run_steps(n):
        # Trainer.train(train_steps=step + n), as run_classifier's evaluation every N steps calls it:
        # it resumes from the checkpoint the previous call saved (model, optimizer, input position)
        # and saves one after its last step (after the last step's log line, so not in any record).
        start = int(trainer.global_step.numpy())
        trainer.train_steps = start + n
        clock.marks = []
        clock.mark()
        trainer.train(dataset_fn)
        cpus = clock.deltas()[-n:]  # marks: here, "resumed from ..." (not on the first call), one per step
        walls = [r["seconds"] for r in trainer.loop_history[-n:]]
        steps = [dict(padded=p, real=r, seconds=w, cpu_seconds=c)
                 for (p, r), w, c in zip(tokens[start:start + n], walls, cpus, strict=True)]
        return dict(steps=steps, losses=trainer.step_losses[-n:], load=clock.loads())

    try:
        serve(run_steps, args.warmup_steps, per_round,
              dict(params=count_parameters(trainer.model), mix_padded_length=mix_padded))
    finally:
        tf.io.gfile.rmtree(output_dir)


def _batch_tokens(dataset, steps):
    """(padded tokens, real tokens) of each of the first `steps` batches."""
    return [(int(b["input_mask"].shape[0] * b["input_mask"].shape[1]), int(b["input_mask"].numpy().sum()))
            for b in dataset.take(steps)]


class _Clock:
    """Wall time, this process's CPU time and the 1-minute load average at each mark."""

    def __init__(self):
        self.marks = []

    def mark(self):
        self.marks.append((time.time(), time.process_time(), os.getloadavg()[0]))

    def deltas(self):
        """CPU seconds between consecutive marks."""
        return [b[1] - a[1] for a, b in zip(self.marks[:-1], self.marks[1:], strict=True)]

    def loads(self):
        return [m[2] for m in self.marks]


class _StepLogHandler(logging.Handler):
    """Marks the clock at the Trainer's log lines: after the restore, and after each host call."""

    def __init__(self, clock):
        super().__init__(logging.INFO)
        self.clock = clock

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("step ") or message.startswith("resumed from "):
            self.clock.mark()


def run_tfm(args, padding, precision, xla):
    """tf-models-official's classifier fine-tuning step, as its 'bert/sentence_prediction' experiment runs it."""
    import tensorflow as tf
    import tf_keras

    _pkg_resources_shim()
    from official.core import exp_factory
    from official.nlp.configs import (
        encoders,
        finetuning_experiments,  # noqa: F401 (registers the experiment)
    )
    from official.nlp.tasks import sentence_prediction

    if padding != "fixed":
        raise ValueError("tf-models-official's sentence prediction loader has a fixed seq_length")
    if precision == "bfloat16":
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")  # what its trainer's runtime config sets
    tf_keras.utils.set_random_seed(0)
    layers, hidden = SIZES[args.size]
    experiment = exp_factory.get_exp_config("bert/sentence_prediction")
    total = args.warmup_steps + args.rounds * args.steps
    experiment.override({
        "task": {"model": {"num_classes": NUM_LABELS, "encoder": {"type": "bert", "bert": dict(
            vocab_size=VOCAB_SIZE, hidden_size=hidden, num_layers=layers, num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden, max_position_embeddings=512, type_vocab_size=2)}}},
        "trainer": {"optimizer_config": {
            "learning_rate": {"polynomial": {"initial_learning_rate": LEARNING_RATE, "decay_steps": total}},
            "warmup": {"polynomial": {"warmup_steps": int(total * WARMUP_PROPORTION)}}}},
    }, is_strict=False)
    assert isinstance(experiment.task.model.encoder.get(), encoders.BertEncoderConfig)
    task = sentence_prediction.SentencePredictionTask(experiment.task)
    model = task.build_model()
    optimizer = task.create_optimizer(experiment.trainer.optimizer_config, experiment.runtime)
    metrics = task.build_metrics(training=True)

    arrays = load_arrays(args.data)
    features = dict(input_word_ids=arrays["input_ids"], input_mask=arrays["input_mask"],
                    input_type_ids=arrays["segment_ids"], label_ids=arrays["label_ids"])
    n = len(arrays["input_ids"])
    dataset = (tf.data.Dataset.from_tensor_slices(features).shuffle(n, seed=12345).repeat()
               .batch(args.batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    tokens = _batch_tokens(dataset, total)  # a second iterator of the same seeded dataset: the same batches
    iterator = iter(dataset)

    @tf.function(jit_compile=xla)
    def step(batch):
        return task.train_step(batch, model, optimizer, metrics)["loss"]

    @tf.function
    def train_loop(iterator, num_steps):  # orbit's loop: tf.range over the train step
        losses = tf.TensorArray(tf.float32, size=num_steps)
        for i in tf.range(num_steps):
            losses = losses.write(i, tf.cast(step(next(iterator)), tf.float32))
        return losses.stack()

    one = tf.constant(1)
    done = [0]

    def run_steps(count):
        clock = _Clock()
        clock.mark()
        walls, losses = [], []
        for _ in range(count):
            start = time.time()
            losses.append(float(train_loop(iterator, one).numpy()[0]))
            walls.append(time.time() - start)
            clock.mark()
        steps = [dict(padded=p, real=r, seconds=w, cpu_seconds=c)
                 for (p, r), w, c in zip(tokens[done[0]:done[0] + count], walls, clock.deltas(), strict=True)]
        done[0] += count
        return dict(steps=steps, losses=losses, load=clock.loads())

    serve(run_steps, args.warmup_steps, args.steps,
          dict(params=int(sum(tf.size(v) for v in model.trainable_variables)),
               mix_padded_length=float(args.max_seq_length)))


def _pkg_resources_shim():
    """tensorflow_hub (imported by tf-models-official's task modules) wants pkg_resources.parse_version,
    which setuptools >= 81 no longer ships; give it packaging's parser when it is missing."""
    import importlib.util
    import types

    if importlib.util.find_spec("pkg_resources") is None:
        from packaging.version import parse

        sys.modules["pkg_resources"] = types.SimpleNamespace(parse_version=parse)


SIZES = {"tiny": (2, 128), "small": (4, 512), "base": (12, 768)}  # layers, hidden (BertConfig.named; tiny: smoke tests)
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}


def worker(args):
    import tensorflow as tf

    parts = args.worker.split("-")
    impl, padding, precision, extra = parts[0], parts[1], PRECISIONS[parts[2]], set(parts[3:])
    if "interop0" not in extra:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    fn = run_ours if impl == "ours" else run_tfm
    fn(args, padding, precision, "xla" in extra)


# ---------------------------------------------------------------------------- GPU mode (--gpu)
# Fine-tuning as a GPU user runs it, ours against Hugging Face's Trainer recipe, BERT-base, bf16:
#   glue   classification on the GLUE-like length mix at seq 128 (build_arrays), batch 32
#   squad  span training at seq 384 on SQuAD-like lengths (SQUAD_MEDIAN, SQUAD_SIGMA), batch 32
# Variants:
#   ours-buckets  run_classifier/run_squad's GPU default: XLA, batches cut to the lengths
#                 bert_tf.runners.shapes chooses from the data (one compiled program per length)
#   ours-packed   --pack_sequences (several examples per row of 128; glue only: SQuAD's windows do not pack)
#   ours-padded   --length_buckets=0: every batch at max_seq_length (one program)
#   hf-eager      transformers' BertFor{SequenceClassification,QuestionAnswering}, sdpa attention, the
#                 Trainer's recipe written out: DataCollatorWithPadding (each batch padded to its longest),
#                 torch.autocast bf16, fused AdamW (no decay on biases and LayerNorm), linear warmup/decay,
#                 clip norm 1.0
#   hf-compile    the same with torch.compile(model) (what Trainer(torch_compile=True) does)
# Each variant runs in its own process: --warmup_steps steps (compiling every shape it meets), then
# --rounds timed host calls of --steps steps each. Timings are CUDA-synchronised (ours reads each
# call's losses back; hf calls torch.cuda.synchronize()); examples/s is the median over the timed
# calls; compile seconds are the warm-up's wall time beyond --warmup_steps steps at the timed pace.
GPU_TASKS = {"glue": 128, "squad": 384}  # task -> max_seq_length
GPU_VARIANTS = ("ours-buckets", "ours-packed", "ours-padded", "hf-eager", "hf-compile")
SQUAD_MEDIAN, SQUAD_SIGMA = 160, 0.4  # wordpieces of question + context window (SQuAD v1.1 at 384: mean ~170)
SQUAD_QUESTION = 14  # wordpieces of [CLS] question [SEP]


def squad_arrays(num_examples, max_seq_length, seed=0):
    """Span-training features in the original's names: [CLS] question [SEP] context [SEP], zero-padded,
    the answer span somewhere in the context; random ids."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(SQUAD_MEDIAN), SQUAD_SIGMA, num_examples)), SQUAD_QUESTION + 8,
                      max_seq_length).astype(int)
    positions = np.arange(max_seq_length)[None, :]
    mask = (positions < lengths[:, None]).astype(np.int32)
    ids = rng.integers(1000, VOCAB_SIZE, size=mask.shape).astype(np.int32) * mask
    segments = ((positions >= SQUAD_QUESTION) & (mask == 1)).astype(np.int32)
    start = rng.integers(SQUAD_QUESTION, lengths - 4)
    end = np.minimum(start + rng.integers(0, 4, num_examples), lengths - 2)
    arrays = dict(input_ids=ids, input_mask=mask, segment_ids=segments, start_positions=start.astype(np.int32),
                  end_positions=end.astype(np.int32))
    info = dict(source=f"synthetic SQuAD-like lengths (log-normal, median {SQUAD_MEDIAN}, sigma {SQUAD_SIGMA})",
                examples=num_examples, mean_length=float(lengths.mean()), median_length=float(np.median(lengths)),
                p90_length=float(np.percentile(lengths, 90)), max_length=int(lengths.max()))
    return arrays, info


def gpu_task_arrays(task, examples):
    if task == "glue":
        return build_arrays(examples, GPU_TASKS[task])
    return squad_arrays(examples, GPU_TASKS[task])


def gpu_size(args):
    return "tiny" if args.tiny else "base"


def run_ours_gpu(args, task, variant):
    """Our fine-tuning step as run_classifier / run_squad run it on a GPU: bf16, XLA, the variant's shapes."""
    import tensorflow as tf

    from bert_tf.configs import BertConfig
    from bert_tf.data.packing import pack_examples
    from bert_tf.models import BertClassifier, BertEncoder, BertSpanLabeler
    from bert_tf.pretrained import Pretrained
    from bert_tf.runners import shapes
    from bert_tf.runners.arrays import arrays_dataset_fn
    from bert_tf.runners.classifier import classification_loss
    from bert_tf.runners.common import make_trainer
    from bert_tf.runners.settings import RunSettings
    from bert_tf.runners.squad import span_loss
    from bert_tf.training.memory import retain_freed_memory
    from bert_tf.training.settings import TrainSettings
    from bert_tf.training.strategy import get_strategy

    retain_freed_memory()
    seq = GPU_TASKS[task]
    arrays = load_arrays(args.data)
    lengths = shapes.example_lengths(arrays["input_mask"])
    examples_per_row, real = 1.0, float(lengths.sum() / (len(lengths) * seq))
    chosen = None
    if variant == "ours-packed":
        packed = pack_examples(arrays)
        examples_per_row, real = len(lengths) / packed.num_rows, packed.efficiency()
        arrays = packed.arrays
    elif variant == "ours-buckets":
        chosen = shapes.choose_lengths(lengths, seq)
        real = shapes.real_share(lengths, chosen)
    config = BertConfig.named(gpu_size(args), vocab_size=VOCAB_SIZE)
    gpus = tf.config.list_physical_devices("GPU")
    device = (tf.config.experimental.get_device_details(gpus[0]).get("device_name") or "GPU") if gpus else "CPU"
    settings = RunSettings(
        pretrained=Pretrained(config=config, vocab_file=VOCAB_FILE, init_checkpoint=None, fmt=None, do_lower_case=True),
        strategy=get_strategy("one_device"), dynamic_padding=False,
        train=TrainSettings(learning_rate=LEARNING_RATE, mixed_precision=args.precision, jit_compile=True,
                            iterations_per_loop=args.steps, save_checkpoints_steps=10**9))
    dataset_fn = arrays_dataset_fn(arrays, training=True, seed=settings.train.seed, dynamic_padding=False,
                                   lengths=chosen)
    if task == "glue":
        model_fn, loss_fn = lambda: BertClassifier(BertEncoder(config), NUM_LABELS, skip_padding=False), \
            classification_loss
    else:
        model_fn, loss_fn = lambda: BertSpanLabeler(BertEncoder(config)), span_loss
    output_dir = tempfile.mkdtemp(prefix="bench_finetuning_gpu_")
    try:
        total = args.warmup_steps + args.rounds * args.steps
        trainer = make_trainer(settings, output_dir, model_fn, loss_fn, num_train_steps=total,
                               global_batch_size=args.batch, warmup_proportion=WARMUP_PROPORTION)
        trainer.train_steps = args.warmup_steps
        trainer.train(dataset_fn)  # host calls of --steps steps: compiles every shape it meets
        warmup_seconds = sum(r["seconds"] for r in trainer.loop_history)
        trainer.train_steps = total
        trainer.train(dataset_fn)  # resumes the same input
        timed = trainer.loop_history[-args.rounds:]
    finally:
        tf.io.gfile.rmtree(output_dir)
    per_step = statistics.median(r["seconds"] / r["steps"] for r in timed)
    rates = [r["steps"] * args.batch * examples_per_row / r["seconds"] for r in timed]
    return dict(examples_per_s=statistics.median(rates), rates=rates, device=device,
                compile_seconds=max(0.0, warmup_seconds - args.warmup_steps * per_step),
                real_share=real, shapes=list(chosen) if chosen else [seq], losses=trainer.step_losses[-3:],
                precision=args.precision, batch_unit="rows" if variant == "ours-packed" else "examples")


def run_hf_gpu(args, task, variant):
    """transformers' fine-tuning as its Trainer runs it (see the GPU-mode notes above)."""
    import torch
    import transformers
    from bench_pretraining import HF_ACTIVATION

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    layers, hidden = SIZES[gpu_size(args)]
    config = transformers.BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden, max_position_embeddings=512, type_vocab_size=2, hidden_act=HF_ACTIVATION,
        num_labels=NUM_LABELS, attn_implementation="sdpa")
    model_class = transformers.BertForSequenceClassification if task == "glue" else transformers.BertForQuestionAnswering
    model = model_class(config).to(device).train()
    arrays = load_arrays(args.data)
    rows = []
    for i, n in enumerate(arrays["input_mask"].sum(1)):
        row = dict(input_ids=arrays["input_ids"][i, :n].tolist(), token_type_ids=arrays["segment_ids"][i, :n].tolist(),
                   attention_mask=[1] * int(n))
        if task == "glue":
            row["labels"] = int(arrays["label_ids"][i])
        else:
            row.update(start_positions=int(arrays["start_positions"][i]), end_positions=int(arrays["end_positions"][i]))
        rows.append(row)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "vocab.txt")
        with open(vocab, "w") as f:
            f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                              [f"t{i}" for i in range(VOCAB_SIZE - 5)]) + "\n")
        tokenizer = transformers.BertTokenizerFast(vocab_file=vocab)
    collator = transformers.DataCollatorWithPadding(tokenizer)
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(rows, batch_size=args.batch, shuffle=True, drop_last=True,
                                         collate_fn=collator, pin_memory=cuda, generator=generator)
    no_decay = {id(p) for name, p in model.named_parameters() if "bias" in name or "LayerNorm" in name}
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [dict(params=[p for p in params if id(p) not in no_decay], weight_decay=0.01),
         dict(params=[p for p in params if id(p) in no_decay], weight_decay=0.0)],
        lr=LEARNING_RATE, fused=True)
    total = args.warmup_steps + args.rounds * args.steps
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(total * WARMUP_PROPORTION), total)
    forward = torch.compile(model) if variant == "hf-compile" else model
    precision = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(args.precision)

    def batches():
        while True:
            yield from loader

    stream = batches()
    losses, padded, real = [], [], []

    def run(n):
        for _ in range(n):
            batch = next(stream)
            padded.append(batch["input_ids"].numel())
            real.append(int(batch["attention_mask"].sum()))
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device.type, dtype=precision or torch.float32, enabled=precision is not None):
                loss = forward(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        if cuda:
            torch.cuda.synchronize()

    def timed(n):
        start = time.perf_counter()
        run(n)
        return time.perf_counter() - start

    warmup_seconds = timed(args.warmup_steps)
    seconds = [timed(args.steps) for _ in range(args.rounds)]
    per_step = statistics.median(s / args.steps for s in seconds)
    return dict(examples_per_s=statistics.median(args.steps * args.batch / s for s in seconds),
                rates=[args.steps * args.batch / s for s in seconds],
                device=torch.cuda.get_device_name(0) if cuda else "CPU",
                compile_seconds=max(0.0, warmup_seconds - args.warmup_steps * per_step),
                real_share=sum(real) / max(sum(padded), 1), shapes=[],
                losses=[float(x) for x in losses[-3:]], precision=args.precision, batch_unit="examples")


def gpu_worker(args):
    task, variant = args.gpu_worker.split(":")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_pretraining, for the HF worker
    fn = run_hf_gpu if variant.startswith("hf-") else run_ours_gpu
    print("RESULT" + json.dumps(fn(args, task, variant)), flush=True)


def gpu_main(args, parser):
    """Runs every (task, variant) in its own process, one after another; prints and writes the table."""
    import numpy as np

    sys.path.insert(0, REPO)  # the GLUE fixtures' featurization, when ../shared is there
    tasks = args.tasks.split(",")
    variants = tuple(args.variants.split(",")) if args.variants else GPU_VARIANTS
    if set(tasks) - set(GPU_TASKS) or set(variants) - set(GPU_VARIANTS):
        parser.error(f"--gpu: --tasks from {', '.join(GPU_TASKS)}, --variants from {', '.join(GPU_VARIANTS)}")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    results, infos = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            arrays, infos[task] = gpu_task_arrays(task, args.examples)
            data = os.path.join(tmp, f"{task}.npz")
            np.savez(data, **arrays)
            for variant in variants:
                if variant == "ours-packed" and task == "squad":
                    continue  # SQuAD's windows are not packed (run_squad refuses --pack_sequences)
                command = [sys.executable, os.path.abspath(__file__), f"--gpu_worker={task}:{variant}",
                           f"--data={data}", f"--batch={args.batch}", f"--warmup_steps={args.warmup_steps}",
                           f"--steps={args.steps}", f"--rounds={args.rounds}", f"--precision={args.precision}"] + (
                    ["--tiny"] if args.tiny else [])
                started = time.time()
                try:
                    proc = subprocess.run(command, capture_output=True, text=True, env=env,
                                          timeout=args.worker_timeout)
                except subprocess.TimeoutExpired:
                    print(f"{task} {variant}: stopped after --worker_timeout={args.worker_timeout} s", file=sys.stderr,
                          flush=True)
                    continue
                if proc.returncode != 0 or "RESULT" not in proc.stdout:
                    print(f"{task} {variant}: failed\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
                    continue
                result = dict(json.loads(proc.stdout.split("RESULT", 1)[1]), task=task, variant=variant,
                              wall_seconds=time.time() - started)
                results.append(result)
                print(f"{task} {variant:13s} {result['examples_per_s']:9.1f} examples/s on {result['device']}, "
                      f"compile {result['compile_seconds']:.1f} s, real share {result['real_share']:.1%}",
                      file=sys.stderr, flush=True)
                write_gpu_results(args, results, infos)  # after every variant: a run cut short keeps its figures
    print(write_gpu_results(args, results, infos))
    return 0 if results else 1


def write_gpu_results(args, results, infos) -> str:
    """The table so far; also bench_finetuning_gpu.json and .md in --output_dir when given."""
    text = gpu_report(args, results, infos)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "bench_finetuning_gpu.json"), "w") as f:
            json.dump(dict(args=vars(args), mixes=infos, results=results), f, indent=1)
        with open(os.path.join(args.output_dir, "bench_finetuning_gpu.md"), "w") as f:
            f.write(text + "\n")
    return text


def gpu_report(args, results, infos):
    layers, hidden = SIZES[gpu_size(args)]
    lines = [f"BERT-{gpu_size(args)} (L{layers}/H{hidden}), batch {args.batch}, {args.precision}, "
             f"{args.warmup_steps} warm-up steps, then {args.rounds} timed calls of {args.steps} steps (median)"]
    for task, info in infos.items():
        lines.append(f"{task} at {GPU_TASKS[task]}: {info['source']}; {info['examples']} examples, tokens per "
                     f"example mean {info['mean_length']:.1f}, median {info['median_length']:.0f}, "
                     f"p90 {info['p90_length']:.0f}")
    lines += ["", "| task | variant | device | examples/s | vs best hf | compile s | real tokens / positions | "
              "shapes | last loss |", "|---|---|---|---:|---:|---:|---:|---|---:|"]
    for task in infos:
        rows = [r for r in results if r["task"] == task]
        hf = [r["examples_per_s"] for r in rows if r["variant"].startswith("hf-")]
        for r in rows:
            ratio = f"{r['examples_per_s'] / max(hf):.2f}x" if hf else "-"
            lines.append(f"| {task} | {r['variant']} | {r['device']} | {r['examples_per_s']:.1f} | {ratio} | "
                         f"{r['compile_seconds']:.1f} | {r['real_share']:.1%} | "
                         f"{', '.join(map(str, r['shapes'])) or 'each batch to its longest'} | "
                         f"{r['losses'][-1]:.3f} |")
    lines.append("(examples/s: after warm-up, CUDA-synchronised on a GPU; ours-packed counts the examples in its rows; "
                 "compile s: the warm-up's time beyond its steps at the timed pace)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- driver
def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small", help="BertConfig.named size")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--examples", type=int, default=4096, help="examples in the resampled length mix")
    parser.add_argument("--warmup_steps", type=int, default=None,
                        help="untimed steps first (tracing, first shapes); default 2, --gpu 40")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per round at fixed padding (shorter "
                        "batches: proportionally more); --gpu: steps per timed host call; default 2, --gpu 25")
    parser.add_argument("--rounds", type=int, default=3, help="each variant runs once per round, order rotated "
                        "(--gpu: timed host calls per variant)")
    parser.add_argument("--variants", default=None, help="comma-separated variant names, or 'all' (see the module "
                        "docstring); --gpu: from GPU_VARIANTS")
    parser.add_argument("--gpu", action="store_true", help="GPU mode: ours (XLA, bf16: default shapes, packed, "
                        "padded) against Hugging Face (eager, torch.compile) on a GLUE-like mix and SQuAD-like spans")
    parser.add_argument("--tasks", default=",".join(GPU_TASKS), help="--gpu: comma-separated, from glue, squad")
    parser.add_argument("--tiny", action="store_true", help="--gpu: a 2-layer model instead of BERT-base (CPU tests)")
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                        help="--gpu: the compute precision of every variant")
    parser.add_argument("--output_dir", default=os.environ.get("OUT"),
                        help="--gpu: where bench_finetuning_gpu.json and .md go (default $OUT when set)")
    parser.add_argument("--worker_timeout", type=float, default=None,
                        help="--gpu: stop a variant's process after this many seconds and go on with the next")
    parser.add_argument("--gpu_worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--inter_op_threads", type=int, default=1,
                        help="TensorFlow inter-op threads (1 ran ~1.5x faster on a 2-core CPU; docs/design.md)")
    parser.add_argument("--max_workers", type=int, default=4,
                        help="workers alive at once (each holds ~2-3 GB at BERT-small); more variants run in "
                             "groups of this many, interleaved within a group only")
    parser.add_argument("--json_out", default=None, help="also write every run's per-step records here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    gpu = args.gpu or args.gpu_worker
    args.warmup_steps = args.warmup_steps or (40 if gpu else 2)
    args.steps = args.steps or (25 if gpu else 2)
    if args.gpu_worker:
        gpu_worker(args)
        return
    if args.worker:
        worker(args)
        return
    if args.gpu:
        sys.exit(gpu_main(args, parser))
    variants = list(ALL_VARIANTS if args.variants == "all" else (args.variants or ",".join(DEFAULT_VARIANTS)).split(","))
    for name in variants:
        parts = name.split("-")
        if (len(parts) < 3 or parts[0] not in ("ours", "tfm") or parts[1] not in ("bucket", "dynamic", "fixed", "lengths")
                or parts[2] not in PRECISIONS or not set(parts[3:]) <= {"xla", "interop0"}
                or (parts[0] == "tfm" and parts[1] != "fixed")):
            parser.error(f"--variants: bad variant name {name!r} (expected e.g. ours-bucket-bf16, tfm-fixed-fp32-xla)")
    if min(args.steps, args.warmup_steps, args.rounds, args.max_workers) < 1:
        parser.error("--steps, --warmup_steps, --rounds and --max_workers must be >= 1")

    started = time.time()
    sys.path.insert(0, REPO)
    import numpy as np

    arrays, info = build_arrays(args.examples, args.max_seq_length)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    results = {name: [] for name in variants}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mix.npz")
        np.savez(data, **arrays)
        base = [sys.executable, os.path.abspath(__file__), f"--data={data}"] + [
            f"--{k}={getattr(args, k)}" for k in ("size", "batch", "max_seq_length", "warmup_steps", "steps",
                                                  "rounds", "inter_op_threads")]
        groups = [variants[i:i + args.max_workers] for i in range(0, len(variants), args.max_workers)]
        for group in groups:
            run_group(group, base, env, tmp, args, results, started)
    load_end = os.getloadavg()
    if args.json_out:
        with open(args.json_out + ".tmp", "w") as f:
            json.dump(dict(args=vars(args), mix=info, results=results), f, indent=1)
        os.replace(args.json_out + ".tmp", args.json_out)
    report(args, info, results, load_start, load_end, time.time() - started)


def run_group(group, base, env, tmp, args, results, started):
    """Starts one worker per variant of `group`, runs the interleaved rounds, closes the workers."""
    workers, ready = {}, {}
    try:
        # Start-up, model building, tracing and warm-up one worker at a time, so no worker's
        # warm-up overlaps another's timed steps; the workers then wait for commands.
        for name in group:
            workers[name] = Worker(name, base + [f"--worker={name}"], env, tmp)
            ready[name] = workers[name].ready()
            if ready[name] is None:
                workers.pop(name).fail()
            else:
                print(f"{name}: ready after {time.time() - started:.0f}s, {ready[name]['steps_per_round']} "
                      f"steps per round (mix: {ready[name]['mix_padded_length']:.1f} padded tokens per example)",
                      file=sys.stderr, flush=True)
        for r in range(args.rounds):
            names = [n for n in group if n in workers]
            for name in names[r % len(names):] + names[:r % len(names)] if names else []:
                raw = workers[name].run()
                if raw is None:
                    workers.pop(name).fail()
                    continue
                result = summarize(raw, args.batch)
                result["mix_padded_length"] = ready[name]["mix_padded_length"]
                results[name].append(result)
                print(f"round {r + 1} {name:26s} {result['examples_per_s']:6.2f} examples/s "
                      f"{result['examples_per_cpu_s']:6.2f} per CPU-s, padded length "
                      f"{result['padded_length']:.0f}, load {min(result['load']):.1f}-{max(result['load']):.1f}, "
                      f"CPU share {100 * result['cpu_share']:.0f}%", file=sys.stderr, flush=True)
    finally:
        for worker in workers.values():
            worker.close()


class Worker:
    """One variant's subprocess (fresh TensorFlow state), driven through its stdin/stdout."""

    def __init__(self, name, command, env, tmp):
        self.name = name
        self.stderr_path = os.path.join(tmp, f"{name}.stderr")
        self.stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, env=env)

    def _read(self, prefix):
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
        return None

    def ready(self):
        return self._read("READY")

    def run(self):
        try:
            self.proc.stdin.write("run\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        return self._read("RESULT")

    def fail(self):
        self.close()
        with open(self.stderr_path) as f:
            print(f"{self.name}: failed\n{f.read()[-3000:]}", file=sys.stderr)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def summarize(raw, batch):
    """Throughput of one run from its per-step records."""
    steps = raw["steps"]
    wall = sum(s["seconds"] for s in steps)
    cpu = sum(s["cpu_seconds"] for s in steps)
    examples = batch * len(steps)
    return dict(raw, examples_per_s=examples / wall, examples_per_cpu_s=examples / cpu,
                cpu_share=cpu / wall / (os.cpu_count() or 1),
                padded_length=sum(s["padded"] for s in steps) / examples,
                real_length=sum(s["real"] for s in steps) / examples,
                loss=sum(raw["losses"]) / len(raw["losses"]))


def fit_step_cost(steps):
    """Least squares cpu_seconds = fixed + per_token * padded tokens over step records; None if degenerate."""
    import numpy as np

    x = np.array([s["padded"] for s in steps], float)
    y = np.array([s["cpu_seconds"] for s in steps], float)
    if len(steps) < 3 or np.ptp(x) == 0:
        return None
    per_token, fixed = np.polyfit(x, y, 1)
    return fixed, per_token


def report(args, info, results, load_start, load_end, took):
    layers, hidden = SIZES[args.size]
    ok = {k: v for k, v in results.items() if v}
    print(f"\nBERT-{args.size} (L{layers}/H{hidden}), batch {args.batch}, max_seq_length {args.max_seq_length}, "
          f"{args.steps} timed steps per run after {args.warmup_steps} warm-up steps, {args.rounds} round(s) "
          f"in rotated order, inter-op threads {args.inter_op_threads} unless -interop0")
    print(f"length mix: {info['source']}; {info['examples']} examples, tokens per example mean "
          f"{info['mean_length']:.1f}, median {info['median_length']:.0f}, p90 {info['p90_length']:.0f}, "
          f"max {info['max_length']}")

    def med(name, key):
        return statistics.median(r[key] for r in ok[name])

    def ratio(name, key):
        peer = f"tfm-fixed-{name.split('-')[2]}"
        return f"{med(name, key) / med(peer, key):.2f}x" if peer in ok else "-"

    for runs in ok.values():
        for r in runs:
            # The timed batches are a sample of the mix: scale to its mean padded length as if the
            # cost were all per token (conservative: a short step's fixed costs do not shrink).
            r["examples_per_cpu_s_mix"] = r["examples_per_cpu_s"] * r["padded_length"] / r["mix_padded_length"]
    print("\n| variant | examples/s | vs tfm-fixed | examples/CPU-s | vs tfm-fixed | at the mix's length | "
          "vs tfm-fixed | runs (examples/s) | tokens per example: padded (mix) / real | load avg | CPU share | loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ok:
        runs = ", ".join(f"{r['examples_per_s']:.2f}" for r in ok[name])
        loads = [x for r in ok[name] for x in r["load"]]
        print(f"| {name} | {med(name, 'examples_per_s'):.2f} | {ratio(name, 'examples_per_s')} | "
              f"{med(name, 'examples_per_cpu_s'):.2f} | {ratio(name, 'examples_per_cpu_s')} | "
              f"{med(name, 'examples_per_cpu_s_mix'):.2f} | {ratio(name, 'examples_per_cpu_s_mix')} | {runs} | "
              f"{med(name, 'padded_length'):.1f} ({med(name, 'mix_padded_length'):.1f}) / "
              f"{med(name, 'real_length'):.1f} | {min(loads):.1f}-{max(loads):.1f} | "
              f"{100 * med(name, 'cpu_share'):.0f}% | {med(name, 'loss'):.3f} |")
    failed = [k for k, v in results.items() if not v]
    if failed:
        print(f"failed: {', '.join(failed)}")
    print("(vs tfm-fixed: against tf-models-official at fixed padding in the same precision; examples/CPU-s "
          "divides by the CPU time the worker got, the steadier number when other jobs share the CPUs; padded "
          f"tokens of the timed batches, in brackets over {MIX_SAMPLE_BATCHES} batches of the same pipeline)")

    for precision in PRECISIONS:
        ours = [s for k, v in ok.items() if k.startswith("ours") and k.split("-")[2] == precision
                and len(k.split("-")) == 3 for r in v for s in r["steps"]]
        fit = fit_step_cost(ours)
        if fit:
            fixed, per_token = fit
            bucket = f"ours-bucket-{precision}"
            share = ""
            if fixed <= 0:
                share = "; the fixed part is within the noise of these steps"
            elif bucket in ok:
                tokens = med(bucket, "padded_length") * args.batch
                share = f"; in a bucketed step ({tokens:.0f} tokens) the fixed part is " \
                        f"{100 * fixed / (fixed + per_token * tokens):.0f}%"
            print(f"where the time goes ({precision}, ours, CPU-s per step fitted over {len(ours)} steps): "
                  f"{fixed:.2f} s per step regardless of length (optimizer update, clipping, embedding "
                  f"gradients, host) + {1000 * per_token * 1000:.1f} ms per 1000 padded tokens{share}")
    print(f"load average (1 min) at start {load_start[0]:.2f}, at end {load_end[0]:.2f} on {os.cpu_count()} CPUs "
          f"(a shared machine: every run records its own); took {took:.0f}s")


if __name__ == "__main__":
    main()
