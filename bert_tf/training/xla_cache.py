"""TensorFlow's persistent XLA compilation cache: compiled programs kept on disk, so a resumed or
repeated run loads its XLA-compiled step instead of compiling it again (BERT-base on a GPU: about
a minute before the first step).

TensorFlow reads the cache's directory from TF_XLA_FLAGS (--tf_xla_persistent_cache_directory) once,
at the process's first XLA compilation; it then writes one file per compiled program
(`xla_compile_cache__<signature>__<fingerprint>__XLA_<device>_JIT.pb`) and, in a later process,
loads the file whose signature matches and checks its program's fingerprint before using it
(a changed model, shape or flag compiles anew). A setting made after the process compiled anything
with XLA has no effect, so a program sets it first thing (the training scripts: bert_flags, once
the strategy exists, before the model is built). It is process-wide: the library itself only
reads it (Trainer.run_summary names the directory in effect).

Seen on CPU (XLA CPU, TensorFlow 2.20): a second process loads the program (TensorFlow logs one
harmless "Error parsing text-format tensorflow.XlaSerializedCacheEntry" line first: it tries the text
format before the binary one).
"""

from __future__ import annotations

import os
import shlex
from typing import Optional

FLAG = "--tf_xla_persistent_cache_directory"
DEFAULT_DIR_NAME = "xla_cache"  # <model_dir>/xla_cache
OFF = "none"


def cache_dir(setting: Optional[str], model_dir: Optional[str], jit_compile: bool) -> Optional[str]:
    """The cache directory a run's setting (--xla_cache_dir) names: a path as given; 'none' for no cache;
    unset: <model_dir>/xla_cache when the step is XLA-compiled, else no cache."""
    if setting:
        return None if setting.strip().lower() == OFF else setting
    if jit_compile and model_dir:
        return os.path.join(model_dir, DEFAULT_DIR_NAME)
    return None


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
    compiles anything with XLA; TensorFlow creates the directory when it first writes to it."""
    environ = os.environ if environ is None else environ
    existing = current(environ)
    if existing:
        return existing
    flags = environ.get("TF_XLA_FLAGS", "").strip()
    environ["TF_XLA_FLAGS"] = f"{flags} {FLAG}={shlex.quote(directory)}".strip()
    return directory
