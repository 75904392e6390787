"""TensorFlow's persistent XLA compilation cache: compiled programs kept on disk, so a resumed or
repeated run loads its XLA-compiled step instead of compiling it again (BERT-base on a GPU: about
a minute before the first step).

TensorFlow reads the cache's directory from TF_XLA_FLAGS (--tf_xla_persistent_cache_directory) once,
when its runtime starts: the process's first op, or even its first device listing
(`tf.config.list_physical_devices`, which every strategy does). Set any later, the flag is silently
ignored (seen on TensorFlow 2.20: nothing is ever written). So a program sets it before it touches
TensorFlow's runtime: the training scripts do it first thing (bert_setup.setup_process), deciding
from their flags alone, since asking TensorFlow whether there is a GPU would start the runtime
(`compiles_by_default`). It is process-wide: the library itself only reads it (Trainer.run_summary
names the directory in effect, or none).

With the flag in effect TensorFlow writes one file per compiled program
(`xla_compile_cache__<signature>__<fingerprint>__XLA_<device>_JIT.pb`) and, in a later process,
loads the file whose signature matches and checks its program's fingerprint before using it
(a changed model, shape or flag compiles anew).

Both parts of a program's key depend on TensorFlow's process-wide unique-id counter (`ops.uid()`):
the signature hashes the traced function's name (`__inference_<name>_<uid>`), and the fingerprint
hashes the HLO, whose names and metadata carry the uids of the functions and custom gradients traced
inside it. Every eager op takes a uid too, so a resumed run (restoring a checkpoint first) would
trace its step under other numbers and compile it again. `align_trace_names` moves the counter to
the next multiple of ALIGNMENT just before a program is first traced: a fresh and a resumed run
then trace it under the same numbers whenever they got there below the same multiple (seen:
~10^4-10^5 eager ops before a tiny or BERT-base step; advancing costs ~0.15 s per million).

Seen on CPU (XLA CPU, TensorFlow 2.20): a second process loads the program (TensorFlow logs one
harmless "Error parsing text-format tensorflow.XlaSerializedCacheEntry" line first: it tries the text
format before the binary one).
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from typing import Optional

FLAG = "--tf_xla_persistent_cache_directory"
DEFAULT_DIR_NAME = "xla_cache"  # <model_dir>/xla_cache
OFF = "none"
ALIGNMENT = 1 << 20


def cache_dir(setting: Optional[str], model_dir: Optional[str], jit_compile: bool) -> Optional[str]:
    """The cache directory a run's setting (--xla_cache_dir) names: a path as given; 'none' for no cache;
    unset: <model_dir>/xla_cache when the step is XLA-compiled, else no cache."""
    if setting:
        return None if setting.strip().lower() == OFF else setting
    if jit_compile and model_dir:
        return os.path.join(model_dir, DEFAULT_DIR_NAME)
    return None


def compiles_by_default(jit_compile: Optional[bool], on_tpu: bool) -> bool:
    """Whether a run's step will be XLA-compiled, decided without starting TensorFlow's runtime:
    --jit_compile when given, else on a TPU or where the CUDA driver sees a GPU (the scripts' default
    is XLA on GPUs). A GPU that this TensorFlow cannot use (a CPU-only wheel) only makes the cache
    hold the few programs XLA compiles there."""
    if jit_compile is not None:
        return bool(jit_compile)
    return on_tpu or cuda_device_count() > 0


@functools.lru_cache(maxsize=None)
def cuda_device_count() -> int:
    """The GPUs the CUDA driver shows this process (CUDA_VISIBLE_DEVICES applies), asked of the driver
    library itself (cuInit, cuDeviceGetCount), which TensorFlow then initialises again as it would;
    0 without a driver, without a device, or off Linux. Asked once per process (the scripts' start asks
    for the XLA cache and for the GPU's XLA flags)."""
    if not sys.platform.startswith("linux"):
        return 0
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0  # (e.g. 100, no device; 303, a driver without a GPU, as on CPU machines with CUDA installed)
    return count.value


def current(environ=None) -> Optional[str]:
    """The directory TF_XLA_FLAGS names for the cache (the last one given), None without one."""
    flags = (os.environ if environ is None else environ).get("TF_XLA_FLAGS", "")
    found = None
    words = shlex.split(flags)
    for i, word in enumerate(words):
        if word.startswith(FLAG + "="):
            found = word.split("=", 1)[1]
        elif word == FLAG and i + 1 < len(words):
            found = words[i + 1]
    return found or None


def enable(directory: str, environ=None) -> str:
    """Points TF_XLA_FLAGS at `directory` (keeping its other flags) unless it already names a cache
    directory (the user's choice stands). Returns the directory in effect. Call it before the process
    starts TensorFlow's runtime (any op or device listing); TensorFlow creates the directory when it
    first writes to it."""
    environ = os.environ if environ is None else environ
    existing = current(environ)
    if existing:
        return existing
    flags = environ.get("TF_XLA_FLAGS", "").strip()
    environ["TF_XLA_FLAGS"] = f"{flags} {FLAG}={shlex.quote(directory)}".strip()
    return directory


def align_trace_names(environ=None) -> None:
    """Advances TensorFlow's unique-id counter to the next multiple of ALIGNMENT when a persistent cache
    is in effect (the module's docstring: why); call it right before the call that traces a compiled
    program. Without a cache it does nothing: the names matter to no one."""
    if not current(environ):
        return
    from tensorflow.python.framework import ops  # the counter has no public setter; taking ids is the way

    uid = ops.uid()
    for _ in range(-uid % ALIGNMENT):
        ops.uid()
