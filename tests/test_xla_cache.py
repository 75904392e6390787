"""bert_tf.training.xla_cache: TensorFlow's persistent XLA compilation cache, named in TF_XLA_FLAGS; a second
process loads the program the first one compiled."""

import os
import subprocess
import sys

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
