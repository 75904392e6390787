"""Process set-up for the top-level scripts, once their settings passed the gate (bert_flags.py).

Every training script walks the same path (docs/design.md, "The one path, room by room"):
settings -> the gate -> set-up -> strategy -> run -> one report.
  1. setup_process(): XLA's compilation cache and GPU flags (process-wide, before TensorFlow's runtime
     starts), log lines with times, TensorFlow imported and quietened, remote path flags checked
     (a gs:// path needs TensorFlow's file system);
  2. strategy_and_settings(): --overwrite_output_dir done, the tf.distribute strategy built (make_strategy),
     and what only it decides (XLA by default on a GPU or TPU, the whole step on one device:
     train_settings_for), once what needs TensorFlow to read is resolved: fine-tuning's pretrained model
     (finetune_settings, which keeps the strategy in its RunSettings), pretraining's --init_checkpoint and
     input globs (pretraining_settings, whose strategy run_pretraining takes);
  3. run_and_report(): the run, and its end: one-line errors (fail_with), SIGTERM's exit 143,
     --export_dir, the results printed (report).

Only the top-level scripts import this module (the library never reads flags).
"""

import dataclasses
import logging

import bert_flags
from bert_flags import FLAGS, fail, strategy_name
from bert_tf.errors import (
    ONE_LINE_ERRORS,
    ConfigError,
    ExportError,
    InputDataError,
    OutOfDeviceMemory,
    RemotePathError,
    TrainingPreempted,
)


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


def use_gpu_xla_flags():
    """XLA's GPU flags that the scripts set by default (bert_tf/training/xla_gpu.py), where the CUDA driver
    sees a GPU and --jit_compile is not false; like the cache, before anything starts TensorFlow's runtime.
    Returns the flags added."""
    from bert_tf.training import xla_cache, xla_gpu

    if "jit_compile" not in FLAGS or FLAGS.jit_compile is False or xla_cache.cuda_device_count() == 0:
        return []
    return xla_gpu.apply_gpu_defaults()


def setup_process():
    """The set-up every training script makes after its gate: the XLA cache set (before anything starts
    TensorFlow's runtime), log lines with times, TensorFlow, then every remote path flag checked."""
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
        except RemotePathError as e:
            return f"--{name}={e}"
    return None


def check_remote_path_flags():
    """A one-line exit when a remote path in the flags cannot be reached or read (before any work)."""
    problem = remote_path_problem()
    if problem:
        fail(problem)


def make_strategy():
    """The tf.distribute strategy the flags ask for; a one-line exit when it cannot be built.

    Every training script starts here, so this is also where the training process gets its one
    process-wide setting: glibc's malloc keeps freed memory (bert_tf/training/memory.py; no page
    faults per step). The library itself never changes it."""
    from bert_tf.training.memory import retain_freed_memory
    from bert_tf.training.strategy import get_strategy

    retain_freed_memory()

    bert_flags.exit_hard_from_now(strategy_name() == "multi_worker")
    try:
        return get_strategy(strategy_name(), tpu=FLAGS.tpu_name or FLAGS.master, tpu_zone=FLAGS.tpu_zone,
                            gcp_project=FLAGS.gcp_project)
    except ConfigError as e:
        fail(str(e))


def use_jit(strategy) -> bool:
    """--jit_compile, or by default XLA on TPU/GPU and not on CPU (docs/design.md: it does not pay on CPU)."""
    if FLAGS.jit_compile is not None:
        return FLAGS.jit_compile
    import tensorflow as tf

    return strategy_name() == "tpu" or bool(tf.config.list_logical_devices("GPU"))


def use_whole_step(strategy, jit: bool) -> bool:
    """--compile_whole_step, or by default on where the step is XLA-compiled (`jit`: use_jit) on one GPU
    (benchmarks/RESULTS.md, "Pretraining on a GPU": 1.10x on an H200); a one-line exit where it cannot apply."""
    replicas = strategy.num_replicas_in_sync
    chosen = FLAGS.compile_whole_step if "compile_whole_step" in FLAGS else None
    if chosen is None:
        import tensorflow as tf

        return jit and replicas == 1 and strategy_name() != "tpu" and bool(tf.config.list_logical_devices("GPU"))
    if chosen and not jit:  # (an explicit --jit_compile=false: already the gate's)
        fail(bert_flags.COMPILE_WHOLE_STEP_NEEDS_JIT)
    if chosen and replicas != 1:  # after the strategy: the replicas are the devices TensorFlow finds
        fail(f"--compile_whole_step runs on one device, not {replicas} replicas: drop it, or use "
             "--distribution_strategy=one_device")
    return bool(chosen)


def strategy_and_settings(train, config_asks_checkpointing: bool = False):
    """(strategy, `train` with what the strategy decides: train_settings_for), after --overwrite_output_dir:
    the one place every training script builds its strategy, once what needs TensorFlow to read (a
    checkpoint's format, gs:// globs) was checked, so that inputs that do not go together fail first."""
    bert_flags.overwrite_output_dir_if_asked()
    strategy = make_strategy()
    return strategy, train_settings_for(train, strategy, config_asks_checkpointing)


def train_settings_for(train, strategy, config_asks_checkpointing: bool = False):
    """`train` (bert_flags.train_settings, checked) with XLA as the strategy's devices decide (use_jit), and
    gradient checkpointing as the flag or the model's config.json asks (use_gradient_checkpointing)."""
    jit = use_jit(strategy)
    whole = use_whole_step(strategy, jit)
    if train.steps_per_program > 1 and not whole:
        fail(f"--steps_per_program {train.steps_per_program} runs whole steps in one XLA program: it needs "
             "--compile_whole_step (and --jit_compile, one device)")
    return dataclasses.replace(train, jit_compile=jit, compile_whole_step=whole,
                               gradient_checkpointing=use_gradient_checkpointing(config_asks_checkpointing))


def use_gradient_checkpointing(config_asks: bool) -> bool:
    """--gradient_checkpointing where given; otherwise on when the model's Hugging Face config.json asks for
    it (`config_asks`, bert_tf.configs.asks_gradient_checkpointing), which is logged."""
    chosen = FLAGS.gradient_checkpointing if "gradient_checkpointing" in FLAGS else None
    if config_asks:
        logging.getLogger("bert_tf").info(
            "the model's config.json asks for gradient_checkpointing: %s", "on" if chosen is None else
            f"--gradient_checkpointing={chosen} {'agrees' if chosen else 'keeps it off'}")
    return bool(chosen) if chosen is not None else config_asks


def finetune_settings(train):
    """The RunSettings of a fine-tuning run whose flags passed bert_flags.check_finetune_flags (`train`: its
    TrainSettings): the pretrained model resolved (after set-up: a checkpoint's format is read with
    TensorFlow's checkpoint reader), --overwrite_output_dir done, the strategy built."""
    from bert_tf.pretrained import resolve_lower_case, resolve_pretrained
    from bert_tf.runners.settings import RunSettings

    try:  # a checkpoint, config and vocab that do not go together fail before --overwrite_output_dir clears
        pretrained = resolve_pretrained(FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.vocab_file)
        # the casing in effect (None: the checkpoint's), which finetune_config_kwargs passes on
        FLAGS.do_lower_case = resolve_lower_case(pretrained, FLAGS.do_lower_case, FLAGS.allow_casing_mismatch)
    except ONE_LINE_ERRORS as e:
        fail(str(e))
    strategy, train = strategy_and_settings(train, pretrained.gradient_checkpointing)
    dynamic = FLAGS.dynamic_padding if FLAGS.dynamic_padding is not None else (
        strategy_name() != "tpu" and not train.jit_compile and not FLAGS.pack_sequences and not FLAGS.length_buckets)
    packing = {"max_sequences_per_row": FLAGS.max_sequences_per_row} if FLAGS.max_sequences_per_row is not None else {}
    return RunSettings(pretrained=pretrained, strategy=strategy, train=train, dynamic_padding=dynamic,
                       length_buckets=length_buckets(train.jit_compile, dynamic),
                       aux_lm_weight=FLAGS.aux_lm_weight, pack_sequences=FLAGS.pack_sequences, **packing)


def pretraining_settings(config, bert_config_file=None):
    """(config, strategy) of a pretraining run whose PretrainingConfig passed the gate (run_pretraining.py's
    `pretraining_config`), completed with what needs TensorFlow to read: --init_checkpoint's config, vocab and
    casing (a checkpoint's format is read with TensorFlow's reader) and the model's fit checked then, the input
    globs expanded (gs:// globs); then --overwrite_output_dir, the strategy, and what it decides
    (strategy_and_settings). A problem is one line before --overwrite_output_dir clears anything."""
    from bert_tf.configs import asks_gradient_checkpointing
    from bert_tf.data.pipelines import expand_input_files
    from bert_tf.runners.pretraining import resolve_init_checkpoint

    try:
        changes = {}
        config_asks_checkpointing = bool(bert_config_file) and asks_gradient_checkpointing(bert_config_file)
        if config.init_checkpoint:
            bert_config, vocab_file, do_lower_case, init_checkpoint, config_asks_checkpointing = \
                resolve_init_checkpoint(config.init_checkpoint, bert_config_file, config.vocab_file,
                                        config.do_lower_case)
            changes = dict(bert_config=bert_config, vocab_file=vocab_file, do_lower_case=do_lower_case,
                           init_checkpoint=init_checkpoint)
        config = dataclasses.replace(
            config, input_files=expand_input_files(",".join(config.input_files)),
            eval_input_files=expand_input_files(",".join(config.eval_input_files)) if config.eval_input_files
            else None, **changes)
        if changes:
            config.validate()  # the checkpoint's config against the flags (the gate could not read it)
    except (ConfigError, InputDataError) as e:
        fail(str(e))
    strategy, train = strategy_and_settings(config.train, config_asks_checkpointing)
    return dataclasses.replace(config, train=train), strategy


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


EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a killed process would report


def exit_preempted(error):
    """After SIGTERM the Trainer saved a checkpoint (TrainingPreempted): say so and exit 143."""
    logging.getLogger("bert_tf").warning(str(error))
    bert_flags._exit(EXIT_PREEMPTED)


def fail_with(error: Exception):
    """fail(str(error)); after an out-of-device-memory error the process ends at once (os._exit, output
    flushed): TensorFlow's own teardown can crash then (seen on CPU: a double free while collecting garbage
    after a failed allocation inside the XLA-compiled whole step)."""

    bert_flags.exit_hard_from_now(isinstance(error, OutOfDeviceMemory))
    fail(str(error))


def export_if_asked(strategy):
    """--export_dir, in the scripts that have it: exports the fine-tuned model in --output_dir at the end of
    a run (the chief only)."""
    if "export_dir" not in FLAGS or not FLAGS.export_dir:
        return
    from bert_tf.export import export_model_dir
    from bert_tf.training.strategy import is_chief

    if not is_chief(strategy):
        return
    try:
        out = export_model_dir(FLAGS.output_dir, FLAGS.export_dir)
    except ExportError as e:
        fail(str(e))
    logging.getLogger("bert_tf").info("exported the fine-tuned model as a SavedModel: %s", out)


def report(results, note: str = "", keep_order: bool = False) -> None:
    """The original's eval printout, the one every training script ends with: per split (`results`: {split:
    {metric: value}}; "" for a run without splits, as pretraining's) a `***** Eval results (split, note) *****`
    line, then `  metric = value` lines, sorted unless `keep_order` (SQuAD's official order)."""
    for split, split_results in results.items():
        heading = ", ".join(part for part in (split, note) if part)
        print(f"***** Eval results ({heading}) *****" if heading else "***** Eval results *****")
        for key in (split_results if keep_order else sorted(split_results)):
            print(f"  {key} = {split_results[key]}")


def run_and_report(run, strategy, note: str = "", keep_order: bool = False) -> None:
    """The end of every training script: `run()` -> {split: {metric: value}}, its errors in one line
    (bert_tf/errors.py's ONE_LINE_ERRORS: a BertError, an argument check's ValueError, a TrainingError),
    SIGTERM's exit 143 (TrainingPreempted), --export_dir, then the results (report)."""

    try:
        results = run()
    except ONE_LINE_ERRORS as e:
        fail_with(e)
    except TrainingPreempted as e:
        exit_preempted(e)
    export_if_asked(strategy)
    report(results, note, keep_order)
