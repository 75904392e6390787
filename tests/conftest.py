"""Shared test fixtures: where the optional real-format files live, and tiny vocabularies."""

import contextlib
import importlib
import importlib.util
import json
import logging
import os
import pathlib
import subprocess
import sys
from typing import Optional

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = pathlib.Path(__file__).resolve().parent.parent
TESTDATA = REPO / "tests" / "testdata"
# ../shared sits beside the checkout in CI and in the sessions; tests that need it skip without it.
SHARED = pathlib.Path(os.environ.get("BERT_TF_SHARED", REPO.parent / "shared"))


@contextlib.contextmanager
def imported_script(name):
    """Imports a top-level absl script, and afterwards removes it and the flags it defined.

    Two scripts defining the same flag (e.g. bert_config_file) cannot share one process otherwise.
    """
    from absl import flags

    before = set(flags.FLAGS)
    sys.path.insert(0, str(REPO))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.pop(0)
    try:
        yield module
    finally:
        # its own flags and those it defined through bert_flags' define_* functions
        for flag_name in set(flags.FLAGS) - before:
            delattr(flags.FLAGS, flag_name)
        sys.modules.pop(name, None)


def benchmark_module(name):
    """benchmarks/<name>.py, imported as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script_main(name, *args):
    """A top-level absl script's main with these flags, in this process: its exit code (an `error: ...` line is
    the code itself). What a script sets for its whole process is undone afterwards: the environment
    (bert_setup.use_xla_cache's TF_XLA_FLAGS, so later tests' subprocesses do not inherit a cache in this
    test's folder) and the root logger (bert_setup.setup_process' basicConfig(force=True), which would
    otherwise drop pytest's log capture and print every later test's logs)."""
    environ = dict(os.environ)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with imported_script(name) as script:
        script.FLAGS.unparse_flags()
        script.FLAGS([f"{name}.py", *args])
        try:
            script.main([])
        except SystemExit as e:
            return e.code
        finally:
            os.environ.clear()
            os.environ.update(environ)
            for handler in list(root.handlers):
                if handler not in handlers:
                    root.removeHandler(handler)
            for handler in handlers:
                if handler not in root.handlers:
                    root.addHandler(handler)
            root.setLevel(level)
        return 0


# Environment additions for a script run that must not see a GPU (the run tests compare CPU numbers).
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def run_command(command, *, cwd=REPO, env=None, timeout=600, check=False) -> subprocess.CompletedProcess:
    """Runs `command` (a list) in a fresh process, its output captured as text. env: variables set on top of
    this process' environment (a value None removes one); cwd: the repository unless given. check: the test
    fails unless it exits 0, with a message naming the command, its exit code and the end of its stderr."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    proc = subprocess.run([str(part) for part in command], capture_output=True, text=True, cwd=cwd, env=full_env,
                          timeout=timeout)
    if check and proc.returncode != 0:
        shown = " ".join(str(part) for part in command[1:])
        pytest.fail(f"exit {proc.returncode}: {shown}\n--- stderr (end) ---\n{proc.stderr[-3000:]}", pytrace=False)
    return proc


def run_script(name, *flags, **kwargs) -> subprocess.CompletedProcess:
    """The top-level script `name` (e.g. "run_classifier.py") with these flags, as a user starts it: a fresh
    Python process, from the repository unless cwd says otherwise. Keywords as for run_command."""
    return run_command([sys.executable, REPO / name, *flags], **kwargs)


def shared_path(*parts) -> pathlib.Path:
    """A path under ../shared, or a clean skip when that file is not there."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not available")
    return path


FLOAT32_EPS = 2.0 ** -23  # 1.19e-7: float32's relative spacing; one rounding errs by at most half of it


def float32_tolerance(magnitude: float, summed_terms: int) -> float:
    """The largest difference two float32 computations of one quantity may show when they differ only
    in rounding (the order of a sum, a fused kernel, the CPU's vector width: oneDNN adds in other
    orders under AVX2 than under AVX-512). A sum of n terms in any order errs by at most n * eps
    relative to the terms' magnitude (each of its n roundings by eps / 2, plus the product's), so a
    chain of sums with `summed_terms` terms in all, on values up to `magnitude`, stays within
    summed_terms * eps * magnitude: a worst case, which holds for every CPU and summation order."""
    return summed_terms * FLOAT32_EPS * magnitude


# An int8 export's probabilities against its float32 export's, on tiny models (tests/test_export_int8.py
# says how it was set and measured).
TINY_PROB_TOLERANCE = 0.05


# Makes a training step's allocation fail for real: the loss adds a tile of 2^40 floats (4 TiB), which no
# allocator can give (the error TensorFlow raises for a batch too large for a GPU). `patch`: Python lines that
# put `too_big(<the real loss>)` in the real loss's place; the script and its flags follow `python -c`.
_OUT_OF_MEMORY_BOOTSTRAP = """
import runpy, sys
sys.path.insert(0, {repo!r})
import tensorflow as tf
def too_big(real_loss):
    def loss(model, batch, training):
        value, metrics = real_loss(model, batch, training)
        if training:
            huge = tf.tile(tf.cast(batch["input_ids"][:1, :4], tf.float32), [2 ** 20, 2 ** 18])
            value += tf.minimum(tf.reduce_sum(huge), 0.0)  # 0 (ids are >= 0), which no compiler can know
        return value, metrics
    return loss
{patch}
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def out_of_memory_command(patch: str, script: str, *flags) -> list:
    """[python, -c, <bootstrap>, script, *flags]: `script` run with its training loss made too big to allocate."""
    return [sys.executable, "-c", _OUT_OF_MEMORY_BOOTSTRAP.format(repo=str(REPO), patch=patch), str(script), *flags]


def half_precision_matmul_crashes() -> str:
    """Why this process cannot run bfloat16/float16 matmuls, or "" when it can.

    TF 2.20 picks its oneDNN half-precision kernels by the CPU's own flags, but oneDNN obeys
    ONEDNN_MAX_CPU_ISA: on a CPU with AVX512_BF16/AMX/AVX512_FP16 capped to AVX2, a bfloat16 or
    float16 MatMul segfaults (reproduced with one 8x16 @ 16x4 matmul). A real AVX2 CPU takes TF's
    other kernels and runs these tests.
    """
    from bert_tf import env

    capped = set(env.onednn_info(env.cpu_info()["isa"])["isa_capped_away"] or ())
    lost = sorted(capped & {"AVX512_BF16", "AMX_BF16", "AVX512_FP16"})
    if not lost:
        return ""
    return (f"TF 2.20 segfaults on bfloat16/float16 matmuls when ONEDNN_MAX_CPU_ISA caps away this CPU's "
            f"{'/'.join(lost)}; a real CPU without them runs this test")


# The longest test by far (8-9 minutes on one worker: README, Development): run first, so that under
# `pytest -n 2` it never starts late and ends the suite alone.
LONGEST_MODULE = "test_readme_run.py"


def pytest_collection_modifyitems(config, items):
    """The longest work first, as a scheduler does with jobs of known length: test_readme_run, then the modules
    with slow tests, then the fast ones, which fill both workers up to the end. Each module's tests stay together
    and in order (its module-scoped fixtures are made once per worker)."""
    slow_modules = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item):
        return 0 if item.path.name == LONGEST_MODULE else 1 if item.path in slow_modules else 2

    items.sort(key=rank)  # stable: the collection order within each rank


# `pytest -m "not slow"` is the fast loop (README, Development). A test that runs a script or a whole run in
# a subprocess carries `@pytest.mark.slow`; a module of such tests says `pytestmark = pytest.mark.slow`.
def pytest_runtest_setup(item):
    if item.get_closest_marker("half_precision"):
        why = half_precision_matmul_crashes()
        if why:
            pytest.skip(why)


@pytest.fixture
def shared():
    return shared_path


TINY_VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",",
    "low", "lowest", "hello", "how", "are", "you", "!", "?",
    "the", "a", "cat", "dog", "sat", "on", "mat", ".", "##s",
]


# The tiny encoder the run tests fine-tune (hidden 32, 2 layers; positions up to 64).
TINY_CONFIG = dict(vocab_size=len(TINY_VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, type_vocab_size=2, max_position_embeddings=64)


@pytest.fixture(scope="module")
def tiny_model(request, tmp_path_factory):
    """A folder with vocab.txt (TINY_VOCAB) and bert_config.json, made once per test module: TINY_CONFIG
    updated by the module's TINY_CONFIG_OVERRIDES when it has them."""
    folder = tmp_path_factory.mktemp("tiny_model")
    (folder / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n")
    config = dict(TINY_CONFIG, **getattr(request.module, "TINY_CONFIG_OVERRIDES", {}))
    (folder / "bert_config.json").write_text(json.dumps(config))
    return folder


def tiny_run_settings(folder: pathlib.Path, **train):
    """The RunSettings of an in-process fine-tuning run from `folder` (tiny_model's vocab.txt and
    bert_config.json) on one device: the scripts' finetune_settings without flags; `train`: TrainSettings."""
    from bert_tf.pretrained import resolve_pretrained
    from bert_tf.runners.common import RunSettings
    from bert_tf.training.settings import TrainSettings
    from bert_tf.training.strategy import get_strategy

    pretrained = resolve_pretrained(None, str(folder / "bert_config.json"), str(folder / "vocab.txt"))
    return RunSettings(pretrained=pretrained, strategy=get_strategy("one_device"), train=TrainSettings(**train))


def tiny_pretraining_folder(folder: pathlib.Path, *, lines: Optional[int] = 400, vocab_size: int = 300,
                            records: Optional[dict] = None, dupe_factor: int = 1, **config) -> pathlib.Path:
    """folder with vocab.txt (`vocab_size` wordpieces learned from the sample corpus' first `lines` lines,
    None: all), corpus.txt (those lines), the pretraining records ({file name: (max_seq_length,
    max_predictions_per_seq)}, default train.tfrecord at seq 32 with 5 predictions; `dupe_factor` copies) and
    bert_config.json (`config` with that vocab's size): what a tiny run_pretraining.py needs."""
    from bert_tf.configs import BertConfig
    from bert_tf.data import pretraining_job
    from bert_tf.resources import SAMPLE_CORPUS
    from bert_tf.tokenization import vocab_builder

    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        text = f.read().splitlines()[:lines]
    vocab = vocab_builder.learn_wordpiece_vocab(vocab_builder.count_words(text), vocab_size=vocab_size,
                                                num_unused=0)
    vocab_builder.write_vocab(str(folder / "vocab.txt"), vocab)
    (folder / "corpus.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    for name, (seq, preds) in (records or {"train.tfrecord": (32, 5)}).items():
        pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
            input_file=str(folder / "corpus.txt"), output_file=str(folder / name),
            vocab_file=str(folder / "vocab.txt"), max_seq_length=seq, max_predictions_per_seq=preds,
            dupe_factor=dupe_factor, num_workers=1))
    BertConfig(**dict(config, vocab_size=len(vocab))).to_json_file(str(folder / "bert_config.json"))
    return folder


def tiny_task_model_dir(folder: pathlib.Path, info: dict, *, seq: int, hidden: int, layers: int,
                        weight_sd: Optional[float], seed: int, hidden_act: str = "gelu"):
    """A model_dir of a task model on TINY_VOCAB: vocab.txt, bert_config.json (`hidden` wide, `layers` deep),
    bert_tf_info.json (`info`, lower-cased, max_seq_length `seq`) and ckpt-1 with weights drawn from
    N(0, weight_sd) (a freshly initialised model's outputs are too alike to tell formats apart; weight_sd None:
    the fresh initialisation, LayerNorm scales 1 and shifts 0, biases 0). Returns the Keras model."""
    import numpy as np
    import tensorflow as tf

    from bert_tf.configs import BertConfig, write_run_info
    from bert_tf.model_dir import build_task_model

    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    config = BertConfig(vocab_size=len(TINY_VOCAB), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=64,
                        hidden_act=hidden_act)
    config.to_json_file(str(folder / "bert_config.json"))
    write_run_info(str(folder), do_lower_case=True, max_seq_length=seq, **info)
    model = build_task_model(config, info)
    rng = np.random.default_rng(seed)
    for v in model.trainable_variables if weight_sd is not None else ():
        v.assign(rng.normal(0.0, weight_sd, v.shape).astype("float32"))
    tf.train.Checkpoint(model=model).write(str(folder / "ckpt-1"))
    return model


@pytest.fixture
def tiny_vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    return str(path)


# The start of a `python -c` script for a fresh process that can import tensorflow and
# tensorflow_text but not bert_tf: what a serving system has when it loads our SavedModels.
WITHOUT_BERT_TF = """\
import importlib.abc, json, sys

class NoBertTf(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "bert_tf":
            raise ImportError("bert_tf is blocked in this process")

sys.meta_path.insert(0, NoBertTf())
import tensorflow as tf
import tensorflow_text  # noqa: F401
"""
