"""Flags shared by the top-level scripts: one home for each, so every runner spells them alike.

The original's names and meanings are kept (`use_tpu`, `tpu_name`,
`iterations_per_loop`, ...); the additions follow its style. Only the
top-level scripts import this module (the library never reads flags).
"""

import logging
import os
import sys

from absl import flags

import bert_tf  # noqa: F401  (first, before TensorFlow: quiet start-up, bert_tf/console.py)

FLAGS = flags.FLAGS


def define_tpu_and_strategy_flags():
    flags.DEFINE_bool("use_tpu", False, "Whether to use TPU (same as --distribution_strategy=tpu).")
    flags.DEFINE_string("tpu_name", None, "The Cloud TPU to use: a name, a grpc:// address, or 'local' on a TPU VM.")
    flags.DEFINE_string("tpu_zone", None, "GCE zone of the Cloud TPU (found from metadata when not given).")
    flags.DEFINE_string("gcp_project", None, "GCP project of the Cloud TPU (found from metadata when not given).")
    flags.DEFINE_string("master", None, "[Original flag, unused in TF2] TensorFlow master URL; use --tpu_name.")
    flags.DEFINE_integer("num_tpu_cores", 8, "[Original flag] Only for reporting; TPUStrategy finds the cores.")
    flags.DEFINE_enum("distribution_strategy", "one_device", ["one_device", "mirrored", "multi_worker", "tpu"],
                      "one_device (CPU or first GPU), mirrored (all local GPUs), multi_worker (TF_CONFIG), tpu.")
    flags.DEFINE_enum("mixed_precision", "float32", ["float32", "bfloat16", "float16"],
                      "Compute precision: bfloat16 on TPU and CPU, float16 (with loss scaling) on GPU.")
    flags.DEFINE_bool("jit_compile", None, "XLA-compile the step. Default: on for TPU and GPU, off on CPU.")
    flags.DEFINE_bool("compile_whole_step", None, "Compile the whole training step (forward, loss, gradients, "
                      "clipping, optimizer update) as one XLA program instead of the gradient step and the update "
                      "apart. Needs XLA and one device. Default: on for one GPU (faster there), off elsewhere.")
    flags.DEFINE_string("xla_cache_dir", None, "Keep XLA's compiled programs here, so a resumed or repeated run loads "
                        "its compiled step instead of compiling it again. Default: <output_dir>/xla_cache when the "
                        "step is XLA-compiled (--jit_compile, or by default on a TPU or GPU); 'none': no cache. A path caches every XLA program of "
                        "the run (also the CPU's fused kernels and optimizer update without --jit_compile).")


def define_optimizer_flags(learning_rate: float):
    """How to train, the same for pretraining and fine-tuning: train_settings() reads them (with
    --mixed_precision and --jit_compile of define_tpu_and_strategy_flags)."""
    flags.DEFINE_float("learning_rate", learning_rate, "The peak learning rate for the optimizer.")
    flags.DEFINE_enum("optimizer", "adamw", ["adamw", "lamb"], "adamw as the original; lamb for large batches.")
    flags.DEFINE_float("weight_decay_rate", 0.01, "Decoupled weight decay (not on LayerNorm or biases).")
    flags.DEFINE_float("clip_norm", 1.0, "Clip gradients to this global norm (0 disables).")
    flags.DEFINE_integer("gradient_accumulation_steps", 1, "Micro-batches summed per optimizer step.")
    flags.DEFINE_bool("gradient_checkpointing", None, "Keep only each Transformer block's input for the backward "
                      "pass and compute the block again there: the same gradients with far less activation memory "
                      "(longer sequences, bigger batches) for about a third more time per step. Default: off, or on "
                      "where the model's Hugging Face config.json says \"gradient_checkpointing\": true.")
    flags.DEFINE_integer("save_checkpoints_steps", 1000, "How often to save the model checkpoint.")
    flags.DEFINE_integer("iterations_per_loop", 1000, "How many steps to run per host call (and per log line).")
    flags.DEFINE_integer("keep_checkpoint_max", 5, "How many recent checkpoints to keep.")
    flags.DEFINE_integer("seed", 12345, "Random seed (initialisation, dropout, shuffling).")
    flags.DEFINE_string("profile_steps", None, "N,M: capture a TensorBoard profile of global steps N to M into "
                        "<output_dir>/train (Profile tab, with the tensorboard profile plugin installed).")


def profile_steps():
    """--profile_steps as (N, M), None when not given; a one-line exit when it is not N,M with 1 <= N <= M."""
    text = FLAGS.profile_steps
    if not text:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        first, last = (int(p) for p in parts) if len(parts) == 2 else (int(parts[0]),) * 2
    except ValueError:
        fail(f"--profile_steps must be N,M (global steps, 1 <= N <= M), got {text!r}")
    if not 1 <= first <= last:
        fail(f"--profile_steps must be N,M (global steps, 1 <= N <= M), got {text!r}")
    return first, last


def train_settings(strategy=None, config_asks_checkpointing: bool = False):
    """The TrainSettings (bert_tf.training.loop) the shared training flags describe.

    XLA follows use_jit once the strategy exists; without one (checking the flags before the
    strategy is built) it is off. `config_asks_checkpointing`: the model's config.json asks for
    gradient checkpointing (use_gradient_checkpointing)."""
    from bert_tf.training.loop import TrainSettings

    jit = use_jit(strategy) if strategy is not None else False
    return TrainSettings(
        learning_rate=FLAGS.learning_rate, optimizer=FLAGS.optimizer, weight_decay_rate=FLAGS.weight_decay_rate,
        clip_norm=FLAGS.clip_norm, mixed_precision=FLAGS.mixed_precision,
        jit_compile=jit, compile_whole_step=use_whole_step(strategy, jit) if strategy is not None else False,
        iterations_per_loop=FLAGS.iterations_per_loop, save_checkpoints_steps=FLAGS.save_checkpoints_steps,
        keep_checkpoint_max=FLAGS.keep_checkpoint_max, gradient_accumulation_steps=FLAGS.gradient_accumulation_steps,
        seed=FLAGS.seed, profile_steps=profile_steps(),
        gradient_checkpointing=use_gradient_checkpointing(config_asks_checkpointing),
        head_learning_rate=FLAGS.head_learning_rate if "head_learning_rate" in FLAGS else None)


def use_gradient_checkpointing(config_asks: bool) -> bool:
    """--gradient_checkpointing where given; otherwise on when the model's Hugging Face config.json asks for
    it (`config_asks`, bert_tf.configs.asks_gradient_checkpointing), which is logged."""
    chosen = FLAGS.gradient_checkpointing if "gradient_checkpointing" in FLAGS else None
    if config_asks:
        logging.getLogger("bert_tf").info(
            "the model's config.json asks for gradient_checkpointing: %s", "on" if chosen is None else
            f"--gradient_checkpointing={chosen} {'agrees' if chosen else 'keeps it off'}")
    return bool(chosen) if chosen is not None else config_asks


def use_gpu_xla_flags():
    """XLA's GPU flags that the scripts set by default (bert_tf/training/xla_gpu.py), where the CUDA driver
    sees a GPU and --jit_compile is not false; like the cache, before anything starts TensorFlow's runtime.
    Returns the flags added."""
    from bert_tf.training import xla_cache, xla_gpu

    if "jit_compile" not in FLAGS or FLAGS.jit_compile is False or xla_cache.cuda_device_count() == 0:
        return []
    return xla_gpu.apply_gpu_defaults()


def use_whole_step(strategy, jit: bool) -> bool:
    """--compile_whole_step, or by default on where the step is XLA-compiled (`jit`: use_jit) on one GPU
    (benchmarks/RESULTS.md, "Pretraining on a GPU": 1.10x on an H200); a one-line exit where it cannot apply."""
    replicas = strategy.num_replicas_in_sync
    chosen = FLAGS.compile_whole_step if "compile_whole_step" in FLAGS else None
    if chosen is None:
        import tensorflow as tf

        return jit and replicas == 1 and strategy_name() != "tpu" and bool(tf.config.list_logical_devices("GPU"))
    if chosen and not jit:
        fail("--compile_whole_step compiles the step with XLA: it needs --jit_compile (off by default on CPU)")
    if chosen and replicas != 1:
        fail(f"--compile_whole_step runs on one device, not {replicas} replicas: drop it, or use "
             "--distribution_strategy=one_device")
    return bool(chosen)


def use_xla_cache():
    """Points TensorFlow's persistent XLA compilation cache at --xla_cache_dir (bert_tf/training/xla_cache.py)
    in scripts that have the flag: a process-wide setting that TensorFlow reads once, when its runtime
    starts (its first op or device listing), so setup_logging makes it before anything else. Whether
    the step will be XLA-compiled is judged from the flags, not asked of TensorFlow (that would start
    its runtime). Returns the directory in effect, None for none."""
    from bert_tf.training import xla_cache

    if "xla_cache_dir" not in FLAGS:
        return xla_cache.current()
    jit_compile = xla_cache.compiles_by_default(FLAGS.jit_compile, strategy_name() == "tpu")
    directory = xla_cache.cache_dir(FLAGS.xla_cache_dir, FLAGS.output_dir, jit_compile)
    return xla_cache.enable(directory) if directory else xla_cache.current()


def strategy_name() -> str:
    if FLAGS.use_tpu and FLAGS.distribution_strategy not in ("one_device", "tpu"):
        fail(f"--use_tpu contradicts --distribution_strategy={FLAGS.distribution_strategy}")
    return "tpu" if FLAGS.use_tpu else FLAGS.distribution_strategy


# Set once a multi-worker strategy runs: its gRPC server keeps the interpreter from ever finishing
# its shutdown, so after a failure (e.g. a dead peer) the process must end with os._exit.
_HARD_EXIT = False


def make_strategy():
    """The tf.distribute strategy the flags ask for; a one-line exit when it cannot be built.

    Every training script starts here, so this is also where the training process gets its one
    process-wide setting: glibc's malloc keeps freed memory (bert_tf/training/memory.py; no page
    faults per step). The library itself never changes it."""
    from bert_tf.training.memory import retain_freed_memory
    from bert_tf.training.strategy import StrategyError, get_strategy

    retain_freed_memory()

    global _HARD_EXIT
    _HARD_EXIT = strategy_name() == "multi_worker"
    try:
        return get_strategy(strategy_name(), tpu=FLAGS.tpu_name or FLAGS.master, tpu_zone=FLAGS.tpu_zone,
                            gcp_project=FLAGS.gcp_project)
    except StrategyError as e:
        fail(str(e))


def use_jit(strategy) -> bool:
    """--jit_compile, or by default XLA on TPU/GPU and not on CPU (docs/design.md: it does not pay on CPU)."""
    if FLAGS.jit_compile is not None:
        return FLAGS.jit_compile
    import tensorflow as tf

    return strategy_name() == "tpu" or bool(tf.config.list_logical_devices("GPU"))


EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a killed process would report


def exit_preempted(error):
    """After SIGTERM the Trainer saved a checkpoint (TrainingPreempted): say so and exit 143."""
    logging.getLogger("bert_tf").warning(str(error))
    _exit(EXIT_PREEMPTED)


def _exit(code):
    if _HARD_EXIT:
        if isinstance(code, str):
            print(code, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(1 if isinstance(code, str) else code)
    sys.exit(code)


def fail(message: str):
    """Exits with one line naming the problem (the house rule for bad input): `error: <message>` on stderr,
    once (not also as a log line)."""
    _exit(f"error: {message}")


def fail_with(error: Exception):
    """fail(str(error)); after an out-of-device-memory error the process ends at once (os._exit, output
    flushed): TensorFlow's own teardown can crash then (seen on CPU: a double free while collecting garbage
    after a failed allocation inside the XLA-compiled whole step)."""
    from bert_tf.training.device_memory import OutOfDeviceMemory

    global _HARD_EXIT
    _HARD_EXIT = _HARD_EXIT or isinstance(error, OutOfDeviceMemory)
    fail(str(error))


def setup_logging():
    """The start of every runner: the XLA cache set (before anything starts TensorFlow's runtime), log
    lines with times, then every remote path flag checked."""
    use_xla_cache()
    use_gpu_xla_flags()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", force=True)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    check_remote_path_flags()


def remote_path_flags():
    """(flag name, path) for every remote path (gs://, ...) given in a string flag; lists split on commas."""
    from bert_tf import fileio

    found = {}
    for name, flag in sorted(FLAGS._flags().items()):
        value = flag.value
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if not isinstance(item, str):
                continue
            for path in (p.strip() for p in item.split(",")):
                if fileio.is_remote(path) and fileio.scheme(path) not in fileio.NON_FILE_SCHEMES:
                    found.setdefault(path, name)
    return [(name, path) for path, name in found.items()]


def remote_path_problem():
    """'--flag=<path>: why' for the first remote path in the flags that cannot be reached or read; else None."""
    from bert_tf import fileio

    for name, path in remote_path_flags():
        try:
            fileio.check_remote(path)
        except fileio.RemotePathError as e:
            return f"--{name}={e}"
    return None


def check_remote_path_flags():
    """A one-line exit when a remote path in the flags cannot be reached or read (before any work)."""
    problem = remote_path_problem()
    if problem:
        fail(problem)


def define_packing_flags(unit: str, default_constant: str, note: str = ""):
    """--pack_sequences and --max_sequences_per_row, for pretraining (instances) and fine-tuning (examples)."""
    flags.DEFINE_bool("pack_sequences", False, f"Pack several {unit} into each row of max_seq_length (attention "
                      "within each, positions restarting): fixed shapes without most of the padding, for XLA on "
                      f"TPU/GPU. Batch sizes then count rows.{' ' + note[0].upper() + note[1:] + '.' if note else ''}")
    flags.DEFINE_integer("max_sequences_per_row", None, f"With --pack_sequences: the most {unit} in one row "
                         f"(default: bert_tf.data.packing.{default_constant}).")


def define_doc_stride_flag(default: int = 128, note: str = ""):
    """--doc_stride, SQuAD's flag: how far apart the windows over a long text start."""
    flags.DEFINE_integer("doc_stride", default, "A text too long for one window is cut into overlapping windows "
                         "that start this many word pieces apart (the last one reaching the end)."
                         f"{' ' + note if note else ''}")


def define_long_input_flags():
    """--long_inputs, --doc_stride and --window_aggregation: what a classifier does with inputs longer than one window."""
    flags.DEFINE_enum("long_inputs", "truncate", ["truncate", "windows"], "Inputs longer than --max_seq_length: "
                      "truncate them (the original), or cut them into windows --doc_stride word pieces apart "
                      "(pairs: windows over text_b, text_a whole in each) that training sees all of and "
                      "prediction aggregates into one output per input.")
    define_doc_stride_flag(note="--long_inputs=windows only.")
    flags.DEFINE_enum("window_aggregation", "mean", ["mean", "max", "logmeanexp", "any", "first"], "--long_inputs=windows: "
                      "one output per input from its windows' logits: their mean, each class's max (for 'does the "
                      "text contain X anywhere'), each class's log(mean(exp)) (a soft max), 'any' (the first label only when "
                      "every window says it: a noisy-OR, for 'contains X' with the first label meaning absent), or "
                      "the first window's.")
    flags.DEFINE_enum("window_training", None, ["each", "aggregate", "each_then_aggregate", "each_then_calibrate",
                                                "clean_negatives"],
                      "--long_inputs=windows: train on each window alone with its input's label, on the aggregate "
                      "of an input's windows (the loss on --window_aggregation of their logits, so the window that "
                      "decides gets the gradient), or in two stages: each window for --num_train_epochs (that model "
                      "kept in <output_dir>/each_window), then from it the aggregate for a quarter of that "
                      "(each_then_aggregate), or no training and the output layer calibrated (the first label's "
                      "logit shifted, every logit scaled) to fit the training inputs' aggregate (each_then_calibrate); "
                      "or clean_negatives (max, logmeanexp, any; the first label meaning 'found nowhere'): every "
                      "window of a first-label input trained as that label, another input's label on the aggregate "
                      "of its windows (kept in <output_dir>/clean_negatives), then that calibration. "
                      "Default: clean_negatives for max, each_then_calibrate for any, each for the others (measured: "
                      "docs/finetuning.md).")


def check_long_input_flags():
    """A one-line exit for window settings no run can use (before the TensorFlow start-up)."""
    from bert_tf.tasks.windows import check_window_settings

    try:
        check_window_settings(FLAGS.long_inputs, FLAGS.doc_stride, FLAGS.window_aggregation, FLAGS.window_training)
    except ValueError as e:
        fail(str(e))


def define_overwrite_flag():
    flags.DEFINE_bool("overwrite_output_dir", False, "Delete a previous run's checkpoints, summaries and model "
                      "files from --output_dir and start afresh (without it, a run resumes from them, and one "
                      "with a different model or task is refused).")


def overwrite_output_dir_if_asked(protected=()):
    """--overwrite_output_dir: clears the previous run from --output_dir (never a path in `protected`)."""
    import os  # (local: this helper does not rely on the module's imports)

    if not FLAGS.overwrite_output_dir or not FLAGS.output_dir:
        return
    out = os.path.abspath(FLAGS.output_dir)
    for path in (p.strip() for paths in protected if paths for p in paths.split(",")):
        if os.path.abspath(path) == out or os.path.abspath(path).startswith(out + os.sep):
            fail(f"--overwrite_output_dir would delete {path} (inside --output_dir {FLAGS.output_dir})")
    from bert_tf.model_dir import clear_model_dir

    clear_model_dir(FLAGS.output_dir)


def define_finetuning_flags(max_seq_length: int = 128, learning_rate: float = 5e-5, train_batch_size: int = 32,
                            eval_batch_size: int = 8, num_train_epochs: float = 3.0):
    """The flags every fine-tuning runner shares, with the original run_classifier.py's names and defaults."""
    flags.DEFINE_string("bert_config_file", None, "The bert_config.json (or Hugging Face config.json) of the "
                        "pre-trained model (found beside "
                        "--init_checkpoint when not given).")
    flags.DEFINE_string("vocab_file", None, "The vocab.txt of the pre-trained model (found beside "
                        "--init_checkpoint when not given).")
    flags.DEFINE_string("output_dir", None, "Where the model checkpoints and outputs are written.")
    define_overwrite_flag()
    flags.DEFINE_string("init_checkpoint", None, "Initial weights: an original bert_model.ckpt, a Hugging Face "
                        "folder or .safetensors, or a bert_tf model directory / checkpoint.")
    flags.DEFINE_bool("do_lower_case", True, "Lower-case the input (True for uncased models, False for cased).")
    flags.DEFINE_bool("allow_casing_mismatch", False, "Warn instead of failing when --do_lower_case disagrees "
                      "with the checkpoint.")
    flags.DEFINE_integer("max_seq_length", max_seq_length, "Maximum total input length in word pieces after "
                         "tokenization; longer inputs are truncated, shorter ones padded.")
    flags.DEFINE_bool("do_train", False, "Whether to run training.")
    flags.DEFINE_bool("do_eval", False, "Whether to run eval on the dev set.")
    flags.DEFINE_bool("do_predict", False, "Whether to run the model in inference mode on the test set.")
    flags.DEFINE_integer("train_batch_size", train_batch_size, "Total batch size for training.")
    flags.DEFINE_integer("eval_batch_size", eval_batch_size, "Total batch size for eval.")
    flags.DEFINE_integer("predict_batch_size", eval_batch_size, "Total batch size for predict.")
    flags.DEFINE_float("num_train_epochs", num_train_epochs, "Total number of training epochs to perform.")
    flags.DEFINE_float("warmup_proportion", 0.1, "Proportion of training for linear learning rate warmup.")
    flags.DEFINE_float("head_learning_rate", None, "The peak learning rate of the task head (its output layer), "
                       "on the same warmup and decay. Default: --learning_rate (the original), and 100x it for a "
                       "classifier that reads the mean of the tokens (--pooling=mean), whose small features leave "
                       "a head at the encoder's rate nearly still.")
    flags.DEFINE_integer("eval_every_steps", None, "Evaluate on dev every N steps during training and keep the "
                         "best model in <output_dir>/best. Default with --do_train --do_eval: at the end of each "
                         "epoch; 0: only at the end.")
    flags.DEFINE_float("aux_lm_weight", 0.0, "GPT-1's auxiliary objective: add this times the LM loss on the task "
                       "inputs (masked LM; next-token for a left-to-right model). GPT-1 used 0.5; 0 = off (BERT).")
    flags.DEFINE_bool("dynamic_padding", None, "Batch by length and pad each batch only to its longest "
                      "example. Default: on, except on TPU, under XLA and with --pack_sequences (fixed shapes).")
    flags.DEFINE_integer("length_buckets", None, "Under XLA without --dynamic_padding or --pack_sequences: cut "
                         "each batch to one of this many lengths chosen from the data (batches drawn by length; "
                         "one compiled program per length), 0: pad every batch to --max_seq_length. Default: "
                         "bert_tf.runners.shapes.DEFAULT_LENGTH_BUCKETS under XLA on GPU (and CPU), 0 on TPU.")
    define_packing_flags("examples", "FINETUNE_MAX_SEQUENCES_PER_ROW", "predictions come back one per example "
                         "in input order; not for SQuAD")
    flags.DEFINE_string("export_dir", None, "At the end, export the model of --output_dir (its latest checkpoint) "
                        "as a SavedModel that serves raw text, to this new or empty folder (TF Serving: "
                        "<models>/<name>/<version>). For <output_dir>/best use export_savedmodel.py.")
    define_tpu_and_strategy_flags()
    define_optimizer_flags(learning_rate)


def finetune_settings():
    """Resolves the pretrained model and builds the RunSettings the fine-tuning flags describe."""
    from bert_tf.configs import ConfigError
    from bert_tf.pretrained import FinetuneError, check_lower_case, resolve_pretrained
    from bert_tf.runners.settings import RunSettings
    from bert_tf.tokenization import VocabError

    if not FLAGS.output_dir:
        fail("--output_dir is required")
    _check_export_dir()  # before hours of training, not after
    try:  # a checkpoint, config and vocab that do not go together fail before --overwrite_output_dir clears
        pretrained = resolve_pretrained(FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.vocab_file)
        check_lower_case(pretrained, FLAGS.do_lower_case, FLAGS.allow_casing_mismatch)
    except (FinetuneError, ConfigError, VocabError, ValueError) as e:
        fail(str(e))
    overwrite_output_dir_if_asked(protected=(FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.vocab_file))
    strategy = make_strategy()
    if FLAGS.pack_sequences and FLAGS.dynamic_padding:
        fail("--dynamic_padding and --pack_sequences cannot be combined: packed rows have one fixed length")
    if FLAGS.length_buckets and (FLAGS.pack_sequences or FLAGS.dynamic_padding):
        fail("--length_buckets cannot be combined with --pack_sequences or --dynamic_padding: each shapes the "
             "batches its own way")
    train = train_settings(strategy, pretrained.gradient_checkpointing)
    dynamic = FLAGS.dynamic_padding if FLAGS.dynamic_padding is not None else (
        strategy_name() != "tpu" and not train.jit_compile and not FLAGS.pack_sequences and not FLAGS.length_buckets)
    packing = {"max_sequences_per_row": FLAGS.max_sequences_per_row} if FLAGS.max_sequences_per_row is not None else {}
    return RunSettings(pretrained=pretrained, strategy=strategy, train=train, dynamic_padding=dynamic,
                       length_buckets=length_buckets(train.jit_compile, dynamic),
                       aux_lm_weight=FLAGS.aux_lm_weight, pack_sequences=FLAGS.pack_sequences, **packing)


def length_buckets(jit_compile: bool, dynamic_padding: bool) -> int:
    """--length_buckets, or by default a few static lengths under XLA (GPU, or CPU with --jit_compile) where
    no other shaping is asked for. Not on TPU by default: a TPU step needs one shape on every core, and no
    TPU was at hand to check bucketed input on."""
    if FLAGS.length_buckets is not None:
        return FLAGS.length_buckets
    if not jit_compile or dynamic_padding or FLAGS.pack_sequences or strategy_name() == "tpu":
        return 0
    from bert_tf.runners.shapes import DEFAULT_LENGTH_BUCKETS

    return DEFAULT_LENGTH_BUCKETS


def _check_export_dir():
    """--export_dir must be new or empty: an export never replaces one a server may be reading."""
    from bert_tf import fileio

    path = FLAGS.export_dir
    if not path or not fileio.exists(path):
        return
    if fileio.is_remote(path):
        import tensorflow as tf

        isdir, listdir = tf.io.gfile.isdir, tf.io.gfile.listdir
    else:
        isdir, listdir = os.path.isdir, os.listdir
    if not isdir(path):
        fail(f"{path}: --export_dir exists and is not a directory")
    if listdir(path):
        fail(f"{path}: --export_dir exists and is not empty; pass a new folder (e.g. the next version number)")


def export_if_asked(settings):
    """--export_dir: exports the fine-tuned model in --output_dir at the end of a run (the chief only)."""
    if not FLAGS.export_dir:
        return
    from bert_tf.export import ExportError, export_model_dir
    from bert_tf.training.strategy import is_chief

    if not is_chief(settings.strategy):
        return
    try:
        out = export_model_dir(FLAGS.output_dir, FLAGS.export_dir)
    except ExportError as e:
        fail(str(e))
    logging.getLogger("bert_tf").info("exported the fine-tuned model as a SavedModel: %s", out)


def finetune_config_kwargs(settings) -> dict:
    """The run-config fields every fine-tuning runner takes from the shared flags."""
    return dict(
        output_dir=FLAGS.output_dir, run=settings, max_seq_length=FLAGS.max_seq_length,
        do_lower_case=FLAGS.do_lower_case, do_train=FLAGS.do_train, do_eval=FLAGS.do_eval,
        do_predict=FLAGS.do_predict, train_batch_size=FLAGS.train_batch_size, eval_batch_size=FLAGS.eval_batch_size,
        predict_batch_size=FLAGS.predict_batch_size, num_train_epochs=FLAGS.num_train_epochs,
        warmup_proportion=FLAGS.warmup_proportion, eval_every_steps=FLAGS.eval_every_steps)


def run_and_report(run_fn, cfg, settings) -> None:
    """Runs a fine-tuning `run(cfg)`: one-line errors, SIGTERM exit, --export_dir, the original's eval printout."""
    from bert_tf.pretrained import FinetuneError
    from bert_tf.tasks import TaskDataError
    from bert_tf.training.loop import TrainingError, TrainingPreempted

    try:
        results = run_fn(cfg)
    except (FinetuneError, TaskDataError, TrainingError, ValueError) as e:
        fail_with(e)
    except TrainingPreempted as e:
        exit_preempted(e)
    export_if_asked(settings)
    for split, split_results in results.items():
        print(f"***** Eval results ({split}) *****")
        for key in sorted(split_results):
            print(f"  {key} = {split_results[key]}")


# ------------------------------------------------------------------ Apache Beam (README "Beyond one machine")
def define_beam_flags():
    if "runner" in flags.FLAGS:  # defined by another script imported in the same process (tests)
        return
    flags.DEFINE_string("runner", None, "Run on Apache Beam with this runner (pip install -e '.[beam]'): "
                        "DirectRunner (local worker processes, --num_workers of them), DataflowRunner, FlinkRunner, "
                        "...; Beam's pipeline options (--project, --region, --temp_location, --setup_file, ...) are "
                        "passed through. Default: the local tool, no Beam.")


def parse_flags_and_beam_options(argv):
    """app.run's flags_parser: our flags; what they do not know stays in argv for Beam's pipeline options.
    A bad or missing flag is one line (app.run prints a traceback for a custom parser's error)."""
    try:
        return flags.FLAGS(argv, known_only=True)
    except flags.Error as e:
        _exit(f"{os.path.basename(argv[0])}: error: {e}")


def beam_args(argv, script: str):
    """The arguments left for Beam; without --runner there must be none (a mistyped flag is an error)."""
    rest = list(argv[1:])
    if rest and not flags.FLAGS.runner:
        sys.exit(f"{script}: error: unknown flag(s) {' '.join(rest)} (Beam pipeline options need --runner)")
    if flags.FLAGS.runner:
        import importlib.util

        if importlib.util.find_spec("apache_beam") is None:
            sys.exit(f"{script}: error: --runner={flags.FLAGS.runner} needs Apache Beam, which is not installed "
                     "(pip install -e '.[beam]')")
    return rest
