"""bert_tf.training.xla_cache: TensorFlow's persistent XLA compilation cache, named in TF_XLA_FLAGS; a second
process loads the program the first one compiled."""

import os
import subprocess
import sys

import pytest
from conftest import CPU_ONLY, TESTDATA, TINY_CONFIG, run_script, tiny_pretraining_folder

from bert_tf.training import xla_cache

FLAG = "--tf_xla_persistent_cache_directory"


def test_cache_dir_follows_the_setting_then_xla():
    assert xla_cache.cache_dir(None, "/runs/a", jit_compile=True) == os.path.join("/runs/a", "xla_cache")
    assert xla_cache.cache_dir(None, "/runs/a", jit_compile=False) is None
    assert xla_cache.cache_dir("", "/runs/a", jit_compile=True) == os.path.join("/runs/a", "xla_cache")
    assert xla_cache.cache_dir("/cache", "/runs/a", jit_compile=False) == "/cache"
    assert xla_cache.cache_dir("None", "/runs/a", jit_compile=True) is None


def test_enable_keeps_other_flags_and_a_cache_the_user_named():
    env = {"TF_XLA_FLAGS": "--tf_xla_auto_jit=2"}
    assert xla_cache.current(env) is None
    assert xla_cache.enable("/runs/my dir/xla_cache", env) == "/runs/my dir/xla_cache"
    assert env["TF_XLA_FLAGS"] == f"--tf_xla_auto_jit=2 {FLAG}='/runs/my dir/xla_cache'"
    assert xla_cache.current(env) == "/runs/my dir/xla_cache"
    mine = {"TF_XLA_FLAGS": f"{FLAG}=/mine"}
    assert xla_cache.enable("/runs/a/xla_cache", mine) == "/mine" and mine["TF_XLA_FLAGS"] == f"{FLAG}=/mine"
    assert xla_cache.current({"TF_XLA_FLAGS": f"{FLAG} /spaced"}) == "/spaced"
    assert xla_cache.enable("/c", {}) == "/c"


PROGRAM = """
import tensorflow as tf
w = tf.constant(tf.random.stateless_normal((32, 32), seed=[1, 2]))
@tf.function(jit_compile=True)
def f(x):
    return tf.reduce_sum(tf.nn.gelu(tf.matmul(x, w)))
print("RESULT", float(f(tf.ones((4, 32)))))
"""


@pytest.mark.slow
def test_second_process_loads_the_compiled_program(tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="device_executable_persistor=3")
    env.pop("TF_XLA_FLAGS", None)
    xla_cache.enable(str(cache), env)

    def run():
        proc = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.split("RESULT")[1].strip(), proc.stderr

    first, log = run()
    (entry,) = cache.iterdir()  # one program, written by the process that compiled it
    assert entry.name.startswith("xla_compile_cache__") and "Verifying loaded cache entry" not in log
    stamp = entry.stat().st_mtime_ns
    second, log = run()
    assert "Verifying loaded cache entry" in log  # loaded, its fingerprint checked
    assert [p.name for p in cache.iterdir()] == [entry.name] and entry.stat().st_mtime_ns == stamp
    assert second == first


def test_the_default_is_judged_without_tensorflow():
    assert xla_cache.compiles_by_default(True, on_tpu=False) and not xla_cache.compiles_by_default(False, on_tpu=True)
    assert xla_cache.compiles_by_default(None, on_tpu=True)
    # No GPU here (a CPU machine, with or without a CUDA driver library): XLA is not the default.
    assert xla_cache.cuda_device_count() == 0 and not xla_cache.compiles_by_default(None, on_tpu=False)


ALIGN_PROGRAM = """
import os, sys
import tensorflow as tf
from tensorflow.python.framework import ops
from bert_tf.training import xla_cache
tf.constant(1.0) + 1.0  # some eager ops first, as before a run's first step
before = ops.uid()
xla_cache.align_trace_names()
print("UIDS", before, ops.uid())
"""


def test_align_trace_names_moves_the_counter_to_a_multiple_only_with_a_cache(tmp_path):
    env = dict(os.environ)
    env.pop("TF_XLA_FLAGS", None)

    def uids(environ):
        proc = subprocess.run([sys.executable, "-c", ALIGN_PROGRAM], env=environ, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return [int(x) for x in proc.stdout.split("UIDS")[1].split()]

    before, after = uids(env)
    assert after == before + 1  # no cache: only this test's own reading
    before, after = uids(dict(env, TF_XLA_FLAGS=f"{FLAG}={tmp_path}"))
    assert after % xla_cache.ALIGNMENT == 1 and before < after <= before + xla_cache.ALIGNMENT + 1


# --- Through the scripts, as a user types them (relative paths, fresh processes) ---------------------------

LOADED = "Verifying loaded cache entry: __inference_compute_grads"  # TensorFlow's log line (VLOG 1)


def _script(name, cwd, *args):
    env = dict(CPU_ONLY, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="device_executable_persistor=1", TF_XLA_FLAGS=None)
    return run_script(name, *args, cwd=cwd, env=env, check=True).stderr


def _programs(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture(scope="module")
def pretraining_data(tmp_path_factory):
    return tiny_pretraining_folder(tmp_path_factory.mktemp("xla_cache_pretraining"), **TINY_CONFIG)


def test_run_pretraining_writes_the_cache_and_a_resumed_run_loads_its_step(pretraining_data):
    root = pretraining_data

    def pretrain(output_dir, steps, *extra):
        return _script("run_pretraining.py", root, "--bert_config_file=bert_config.json",
                       "--input_file=train.tfrecord", f"--output_dir={output_dir}", "--max_seq_length=32",
                       "--max_predictions_per_seq=5", "--do_train", "--train_batch_size=8", "--num_warmup_steps=1",
                       f"--num_train_steps={steps}", "--iterations_per_loop=2", "--jit_compile=true", *extra)

    log = pretrain("run", 2)
    assert "XLA cache: run/xla_cache" in log and LOADED not in log
    written = _programs(root / "run" / "xla_cache")
    assert len(written) >= 2  # the gradient step and the optimizer's update at least
    # The same output_dir resumed to more steps: the checkpoint is restored first, the step is loaded.
    log = pretrain("run", 4)
    assert "step 4/4" in log and "step 2/4" not in log  # (it went on from step 2)
    assert LOADED in log and set(written) <= set(_programs(root / "run" / "xla_cache"))
    # Another output_dir sharing the first one's cache: loaded too; nothing is cached in the new folder.
    log = pretrain("other", 2, "--xla_cache_dir=run/xla_cache")
    assert LOADED in log and "XLA cache: run/xla_cache" in log and not (root / "other" / "xla_cache").exists()


def test_run_classifier_writes_the_cache_and_a_second_run_loads_it(tiny_model, tmp_path):
    def classify(output_dir, *extra):
        return _script("run_classifier.py", tmp_path, "--task_name=user", f"--data_dir={TESTDATA / 'classifier'}",
                       f"--vocab_file={tiny_model / 'vocab.txt'}", f"--bert_config_file={tiny_model / 'bert_config.json'}",
                       f"--output_dir={output_dir}", "--max_seq_length=32", "--train_batch_size=8",
                       "--do_train", "--num_train_epochs=0.5", "--jit_compile=true", *extra)

    log = classify("first")
    assert "XLA cache: first/xla_cache" in log and LOADED not in log
    assert _programs(tmp_path / "first" / "xla_cache")
    log = classify("second", "--xla_cache_dir=first/xla_cache")
    assert LOADED in log
