"""What the scripts print: TensorFlow's start-up noise hidden on CPU machines, remote-path failures in one line.

Applied once when `bert_tf` is imported (every script imports it before TensorFlow):

  * On Linux without a CUDA driver (`libcuda.so.1` cannot be loaded), TensorFlow's C++ log
    is limited to fatal lines (TF_CPP_MIN_LOG_LEVEL=3): no `failed call to cuInit` error
    line, no oneDNN / CPU-feature notes. Only when TF_CPP_MIN_LOG_LEVEL is unset, 2 or 3 (what
    the scripts set); a GPU machine keeps TensorFlow's messages and its GPUs.
  * On every machine (with or without a GPU; same condition on TF_CPP_MIN_LOG_LEVEL), the first
    import of tensorflow runs with the process's stderr (file descriptor 2, where C++ writes)
    sent to a temporary file, and everything but exactly TensorFlow's start-up notices is
    written back to stderr after it (STARTUP_NOISE). TensorFlow 2.21 logs them through absl
    before TF_CPP_MIN_LOG_LEVEL can reach them: `WARNING: All log messages before
    absl::InitializeLog() ...`, `... cudart_stub.cc:...] Could not find cuda drivers ...`, and
    wherever its oneDNN ops are on (by default on CPUs with AVX-512 and newer, or with
    TF_ENABLE_ONEDNN_OPTS=1 on any x86 CPU) `... port.cc:...] oneDNN custom operations are on
    ...`, each twice. The CPU-feature notice (`cpu_feature_guard.cc`, two lines) shows where the
    log level lets INFO through, as on a GPU machine.
  * INFO lines that TensorFlow's own Python code logs through absl or its `tensorflow` logger
    (`signature_serialization` renames, `Sharding callback duration`, `Assets written to
    <temporary folder>`, ...) are dropped; its warnings and errors are kept.
  * An uncaught tf.errors.OpError about a remote path (e.g. a gs:// bucket that cannot be
    reached) ends the script with one line `<script>: error: <path>: ...` instead of a traceback.

BERT_TF_VERBOSE=1 turns all three off (TensorFlow's own output and full tracebacks).
"""

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import tempfile
from typing import Callable

from bert_tf import fileio

VERBOSE_ENV = "BERT_TF_VERBOSE"
_TF_PACKAGE = f"{os.sep}tensorflow{os.sep}"
_APPLIED = []
# What TensorFlow's C++ code prints at import, before (2.21) or regardless of its log level (module
# doc). Exact lines only: anything else TensorFlow prints then is passed through.
# (absl's INFO prefix, TensorFlow 2.21; TensorFlow 2.20's own: `2026-11-26 15:01:10.863019: I tensorflow/core/util/`)
_LOG_PREFIX = r"(?:I\d{4} [\d:.]+ +\d+ |\d{4}-\d\d-\d\d [\d:.]+: I (?:[\w.-]+/)*)"
STARTUP_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rf"|{_LOG_PREFIX}cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\."
    rf"|{_LOG_PREFIX}port\.cc:\d+\] oneDNN custom operations are on\. You may see slightly different numerical "
    r"results due to floating-point round-off errors from different computation orders\. To turn them off, set "
    r"the environment variable `TF_ENABLE_ONEDNN_OPTS=0`\."
    rf"|{_LOG_PREFIX}cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU "
    r"instructions in performance-critical operations\."
    r"|To enable the following instructions: [A-Z0-9_ ]+, in other operations, rebuild TensorFlow with the "
    r"appropriate compiler flags\.")


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def cuda_driver_present() -> bool:
    """Whether the CUDA driver library TensorFlow would use can be loaded (Linux); True elsewhere."""
    if not sys.platform.startswith("linux"):
        return True  # (no CUDA stub lines there; nothing to hide)
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


class _TensorFlowInfoFilter(logging.Filter):
    """Drops INFO (and DEBUG) records logged from inside the tensorflow package."""

    def filter(self, record):
        return record.levelno >= logging.WARNING or _TF_PACKAGE not in record.pathname


@contextlib.contextmanager
def stderr_without(drop: Callable[[str], object]):
    """Within the block, lines written to file descriptor 2 (C++ and Python alike) are held in a
    temporary file; after it, those for which drop(line without its newline) is false are written
    to fd 2 in order."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True)
                    if not drop(line.rstrip(b"\r\n").decode("utf-8", "replace"))]
            if kept:
                os.write(2, b"".join(kept))


class _QuietFirstImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` (once, then leaves sys.meta_path) with a loader that executes the
    package under stderr_without(STARTUP_NOISE.fullmatch)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader  # the package sees its own loader
        with stderr_without(STARTUP_NOISE.fullmatch):
            self._loader.exec_module(module)


def _remote_path_in(message: str):
    match = re.search(r"\b[a-z][a-z0-9+.-]*://[^\s'\"]+", message)
    if match and not match.group(0).startswith(("http://", "https://", "grpc://")):
        return match.group(0)
    return None


def _remote_error_hook(previous):
    """sys.excepthook: one line for an uncaught OpError naming a remote path, else `previous`."""

    def hook(exc_type, exc, tb):
        tf = sys.modules.get("tensorflow")  # only TensorFlow raises OpError, so it is loaded then
        path = None
        if tf is not None and isinstance(exc, tf.errors.OpError) and not verbose():
            path = _remote_path_in(exc.message or "")
        if not path:
            return previous(exc_type, exc, tb)

        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "bert_tf"
        print(f"{prog}: error: {fileio.remote_error_message(path, exc)}", file=sys.stderr)

    return hook


def apply() -> None:
    """Sets up the quiet defaults above (once per process); a no-op under BERT_TF_VERBOSE=1."""
    if _APPLIED or verbose():
        return
    _APPLIED.append(True)
    # (3: also a script started by another one, e.g. quickstart.py's steps, which inherit its setting)
    if "tensorflow" not in sys.modules and os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2") in ("2", "3"):
        if not cuda_driver_present():
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        sys.meta_path.insert(0, _QuietFirstImport())
    from absl import logging as absl_logging

    for logger in (absl_logging.get_absl_logger(), logging.getLogger("tensorflow")):
        logger.addFilter(_TensorFlowInfoFilter())
    sys.excepthook = _remote_error_hook(sys.excepthook)
