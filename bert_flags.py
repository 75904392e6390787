"""Flags shared by the top-level scripts, and the gate: their settings built and checked before TensorFlow.

Every script: parse its flags -> build and check its settings here (values, conflicts, required
flags, files that must exist), a bad one ending the process in one `error:` line -> only then
bert_setup.py (logging, XLA flags, TensorFlow, the strategy) -> the run. Nothing in this module
imports TensorFlow (tests/test_gate.py holds it to that); a check that needs it (a gs:// path, the
replicas of the strategy, a checkpoint's format) stays after set-up and says so.

The original's names and meanings are kept (`use_tpu`, `tpu_name`,
`iterations_per_loop`, ...); the additions follow its style. Only the
top-level scripts import this module (the library never reads flags).
"""

import logging
import os
import sys

from absl import flags

import bert_tf  # noqa: F401  (first, before TensorFlow: quiet start-up, bert_tf/console.py)
from bert_tf import fileio

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
    flags.DEFINE_integer("iterations_per_loop", None, "How many steps to run per host call (and per log line). "
                         "Default: from the measured step time, a line at least every 30 s and each tenth of the run.")
    flags.DEFINE_integer("steps_per_program", 1, "Whole training steps per compiled program: one XLA loop runs them "
                         "over that many batches already on the device, so the host launches one program per N "
                         "steps (a GPU/TPU option). Needs the whole step (--compile_whole_step: XLA, one device); "
                         "--num_train_steps, --save_checkpoints_steps and --iterations_per_loop multiples of N.")
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


def train_settings():
    """The TrainSettings (bert_tf/training/settings.py) the shared training flags describe, checked: a one-line
    exit for a value no run can use. XLA is off here; bert_setup.train_settings_for decides it once the
    strategy exists (the default depends on the devices TensorFlow finds)."""
    settings = unchecked_train_settings()
    try:
        settings.check()
    except ValueError as e:
        fail(str(e))
    return settings


def unchecked_train_settings():
    """train_settings() with the flags' conflicts checked but not the values (TrainSettings.check): for a run
    config that checks the TrainSettings it nests (PretrainingConfig.validate)."""
    from bert_tf.training.settings import TrainSettings

    settings = TrainSettings(
        learning_rate=FLAGS.learning_rate, optimizer=FLAGS.optimizer, weight_decay_rate=FLAGS.weight_decay_rate,
        clip_norm=FLAGS.clip_norm, mixed_precision=FLAGS.mixed_precision,
        iterations_per_loop=FLAGS.iterations_per_loop, save_checkpoints_steps=FLAGS.save_checkpoints_steps,
        keep_checkpoint_max=FLAGS.keep_checkpoint_max, gradient_accumulation_steps=FLAGS.gradient_accumulation_steps,
        seed=FLAGS.seed, profile_steps=profile_steps(), steps_per_program=FLAGS.steps_per_program,
        gradient_checkpointing=bool(FLAGS.gradient_checkpointing) if "gradient_checkpointing" in FLAGS else False,
        head_learning_rate=FLAGS.head_learning_rate if "head_learning_rate" in FLAGS else None)
    strategy_name()  # --use_tpu against --distribution_strategy
    if FLAGS.compile_whole_step and FLAGS.jit_compile is False:
        fail(COMPILE_WHOLE_STEP_NEEDS_JIT)
    return settings


COMPILE_WHOLE_STEP_NEEDS_JIT = ("--compile_whole_step compiles the step with XLA: it needs --jit_compile (off by "
                                "default on CPU)")


def strategy_name() -> str:
    if FLAGS.use_tpu and FLAGS.distribution_strategy not in ("one_device", "tpu"):
        fail(f"--use_tpu contradicts --distribution_strategy={FLAGS.distribution_strategy}")
    return "tpu" if FLAGS.use_tpu else FLAGS.distribution_strategy


# Set once a multi-worker strategy runs: its gRPC server keeps the interpreter from ever finishing
# its shutdown, so after a failure (e.g. a dead peer) the process must end with os._exit.
_HARD_EXIT = False


def exit_hard_from_now(on: bool = True) -> None:
    """From now on a failure ends the process with os._exit (bert_setup: a multi-worker strategy, or after
    an out-of-device-memory error)."""
    global _HARD_EXIT
    _HARD_EXIT = _HARD_EXIT or on


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


def check_overwrite_protected(protected=()):
    """The gate's half of --overwrite_output_dir: it would never delete a path in `protected` (an input)."""
    if not FLAGS.overwrite_output_dir or not FLAGS.output_dir:
        return
    out = os.path.abspath(FLAGS.output_dir)
    for path in (p.strip() for paths in protected if paths for p in paths.split(",")):
        if os.path.abspath(path) == out or os.path.abspath(path).startswith(out + os.sep):
            fail(f"--overwrite_output_dir would delete {path} (inside --output_dir {FLAGS.output_dir})")
    if not fileio.is_remote(FLAGS.output_dir):  # (a gs:// folder's holder is read after set-up)
        _refuse_overwriting_a_held_folder()


def _refuse_overwriting_a_held_folder():
    from bert_tf.run_holder import held_message

    if held := held_message(FLAGS.output_dir):  # never clear a folder a live run holds
        fail(f"--overwrite_output_dir: {held}")


def overwrite_output_dir_if_asked():
    """--overwrite_output_dir: clears the previous run from --output_dir (after the gate and set-up;
    check_overwrite_protected ran in the gate)."""
    if not FLAGS.overwrite_output_dir or not FLAGS.output_dir:
        return
    from bert_tf.model_dir import clear_model_dir

    if fileio.is_remote(FLAGS.output_dir):
        _refuse_overwriting_a_held_folder()
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
    flags.DEFINE_bool("do_lower_case", None, "Lower-case the input (True for uncased models, False for cased). "
                      "Default: the checkpoint's casing where it records one (bert_tf_info.json, a Hugging Face "
                      "tokenizer_config.json, Google's cased_/uncased_ folder names), else True.")
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
    flags.DEFINE_integer("early_stopping", 0, "Stop training once the metric that picks <output_dir>/best has "
                         "not improved for this many evaluations in a row (needs --do_eval or --eval_every_steps); "
                         "a rerun on that output_dir trains no further. 0: off.")
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


def check_finetune_flags():
    """The gate of every fine-tuning script: the shared flags checked before TensorFlow loads. Returns the
    checked TrainSettings (XLA still to decide: bert_setup.finetune_settings)."""
    if not FLAGS.output_dir:
        fail("--output_dir is required")
    problem = fileio.export_dir_problem(FLAGS.export_dir, "--export_dir", "pass a new folder (e.g. the next "
                                        "version number)")  # before hours of training, not after
    if problem:
        fail(problem)
    if FLAGS.pack_sequences and FLAGS.dynamic_padding:
        fail("--dynamic_padding and --pack_sequences cannot be combined: packed rows have one fixed length")
    if FLAGS.length_buckets and (FLAGS.pack_sequences or FLAGS.dynamic_padding):
        fail("--length_buckets cannot be combined with --pack_sequences or --dynamic_padding: each shapes the "
             "batches its own way")
    if FLAGS.max_sequences_per_row is not None and FLAGS.max_sequences_per_row < 1:
        fail(f"max_sequences_per_row must be >= 1, got {FLAGS.max_sequences_per_row}")
    if FLAGS.bert_config_file and not fileio.is_remote(FLAGS.bert_config_file):
        from bert_tf.configs import BertConfig
        from bert_tf.errors import ConfigError

        try:
            BertConfig.from_json_file(FLAGS.bert_config_file)
        except ConfigError as e:
            fail(str(e))
    check_overwrite_protected((FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.vocab_file))
    return train_settings()


def finetune_config_kwargs(settings) -> dict:
    """The run-config fields every fine-tuning runner takes from the shared flags."""
    return dict(
        output_dir=FLAGS.output_dir, run=settings, max_seq_length=FLAGS.max_seq_length,
        do_lower_case=FLAGS.do_lower_case, do_train=FLAGS.do_train, do_eval=FLAGS.do_eval,
        do_predict=FLAGS.do_predict, train_batch_size=FLAGS.train_batch_size, eval_batch_size=FLAGS.eval_batch_size,
        predict_batch_size=FLAGS.predict_batch_size, num_train_epochs=FLAGS.num_train_epochs,
        warmup_proportion=FLAGS.warmup_proportion, eval_every_steps=FLAGS.eval_every_steps,
        early_stopping=FLAGS.early_stopping)


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
