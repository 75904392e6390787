"""What the scripts print: TensorFlow's start-up noise hidden on CPU machines, remote-path failures in one line.

Applied once when `bert_tf` is imported (every script imports it before TensorFlow):

  * On Linux without a CUDA driver (`libcuda.so.1` cannot be loaded), TensorFlow's C++ log
    is limited to fatal lines (TF_CPP_MIN_LOG_LEVEL=3): no `failed call to cuInit` error
    line, no oneDNN / CPU-feature notes. Only when TF_CPP_MIN_LOG_LEVEL is unset or 2 (what
    the scripts set); a GPU machine keeps TensorFlow's messages and its GPUs.
  * INFO lines that TensorFlow's own Python code logs through absl or its `tensorflow` logger
    (`signature_serialization` renames, `Sharding callback duration`, `Assets written to
    <temporary folder>`, ...) are dropped; its warnings and errors are kept.
  * An uncaught tf.errors.OpError about a remote path (e.g. a gs:// bucket that cannot be
    reached) ends the script with one line `<script>: error: <path>: ...` instead of a traceback.

BERT_TF_VERBOSE=1 turns all three off (TensorFlow's own output and full tracebacks).
"""

import logging
import os
import re
import sys

from bert_tf import fileio

VERBOSE_ENV = "BERT_TF_VERBOSE"
_TF_PACKAGE = f"{os.sep}tensorflow{os.sep}"
_APPLIED = []


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
    if "tensorflow" not in sys.modules and os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2") == "2":
        if not cuda_driver_present():
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    from absl import logging as absl_logging

    for logger in (absl_logging.get_absl_logger(), logging.getLogger("tensorflow")):
        logger.addFilter(_TensorFlowInfoFilter())
    sys.excepthook = _remote_error_hook(sys.excepthook)
