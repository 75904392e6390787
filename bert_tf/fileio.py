"""Files on local disk or remote file systems (gs://, s3://, hdfs://) through one small API.

Local paths use plain Python, so tools that never need TensorFlow (the data
workers, the vocab builder) do not pay its import time and ~800 MB of memory;
remote paths go through `tf.io.gfile`.
"""

import os
import re
import threading
from typing import Optional

from bert_tf.errors import RemotePathError

# URL schemes that name servers, not files (--tpu_name=grpc://..., a hub address).
NON_FILE_SCHEMES = ("grpc", "http", "https")
# How long check_remote waits for a remote file system's first answer (seconds).
REMOTE_CHECK_TIMEOUT = 60.0
REMOTE_CHECK_TIMEOUT_ENV = "BERT_TF_REMOTE_CHECK_TIMEOUT"


def is_remote(path: str) -> bool:
    return "://" in str(path)


def canonical_path(path: str) -> str:
    """One spelling per file: a local path resolved (relative, ./, symlinks), a URL as given."""
    return path if is_remote(path) else os.path.realpath(path)


def scheme(path: str) -> str:
    return str(path).split("://", 1)[0].lower() if is_remote(path) else ""


def remote_error_message(path: str, error) -> str:
    """One line for a tf.errors.OpError met on `path`: the path, then the reason without libcurl's prose."""
    text = " ".join((getattr(error, "message", None) or str(error)).split())
    detail = re.search(r"error details: (.*?)(?: when reading| when writing|$)", text)
    reason = detail.group(1).strip() if detail else re.split(r" when (?:reading|writing)", text)[0]
    return f"{path}: cannot reach or read it ({reason[:200]})"


def check_remote(path: str) -> None:
    """Raises RemotePathError when `path` is remote and its file system is missing or cannot be reached.

    Does what the run will do first with the path (a glob for a pattern, else an existence
    check), so a bad bucket fails at the start in one line and not after hours, with a traceback.
    A path that simply does not exist yet passes (outputs are created later).
    """
    if not is_remote(path) or scheme(path) in NON_FILE_SCHEMES:
        return
    import tensorflow as tf

    registered = [s for s in tf.io.gfile.get_registered_schemes() if s not in ("", "file")]
    if scheme(path) not in registered:
        raise RemotePathError(f"{path}: this TensorFlow has no file system for {scheme(path)}:// (it has "
                              f"{', '.join(s + '://' for s in sorted(registered)) or 'none'})")
    probe = tf.io.gfile.glob if any(c in path.split("://", 1)[1] for c in "*?[") else tf.io.gfile.exists
    outcome = []
    # In a thread, to bound the wait: TensorFlow's GCS client retries a refused or timed-out connection
    # for minutes (196 s measured for a refused one), and its retry settings are process-wide.
    worker = threading.Thread(target=_run_probe, args=(probe, path, outcome), daemon=True)
    worker.start()
    try:
        seconds = float(os.environ.get(REMOTE_CHECK_TIMEOUT_ENV) or REMOTE_CHECK_TIMEOUT)
    except ValueError:
        seconds = REMOTE_CHECK_TIMEOUT
    worker.join(seconds)
    if not outcome:
        raise RemotePathError(f"{path}: cannot reach it (no answer within {seconds:g} s; {REMOTE_CHECK_TIMEOUT_ENV} "
                              "sets this wait)")
    if outcome[0] is not None:
        raise RemotePathError(remote_error_message(path, outcome[0])) from None


def _run_probe(probe, path, outcome):
    try:
        probe(path)
        outcome.append(None)
    except Exception as e:  # (an OpError is the expected one; anything else is reported too)
        outcome.append(e)


def exists(path: str) -> bool:
    if is_remote(path):
        import tensorflow as tf

        return tf.io.gfile.exists(path)
    return os.path.exists(path)


def export_dir_problem(path: str, name: str, replace_hint: str, overwrite: bool = False) -> Optional[str]:
    """The rule for every export folder, one line or None: new or empty (an export never writes into
    one a server may be reading), or full with `overwrite`. `name` is the flag, `replace_hint` what to
    do about a full folder.
    A local folder is checked without TensorFlow; a remote one (gs://) needs its file system."""
    if not path or not exists(path):
        return None
    if is_remote(path):
        import tensorflow as tf

        isdir, listdir = tf.io.gfile.isdir, tf.io.gfile.listdir
    else:
        isdir, listdir = os.path.isdir, os.listdir
    if not isdir(path):
        return f"{path}: {name} exists and is not a directory"
    if listdir(path) and not overwrite:
        return f"{path}: {name} exists and is not empty; {replace_hint}"
    return None


def open_file(path: str, mode: str = "r"):
    """A file object for `path`; text modes read and write UTF-8."""
    if is_remote(path):
        import tensorflow as tf

        return tf.io.gfile.GFile(path, mode)
    return open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def make_parent_dirs(path: str) -> None:
    """Creates the folders a file at `path` goes into, as `mkdir -p` would (writers call it first, so
    `--output_file=data/train.tfrecord` needs no `mkdir data`). A parent that is a file raises OSError."""
    parent = os.path.dirname(path)
    if not parent:
        return
    if is_remote(path):
        import tensorflow as tf

        tf.io.gfile.makedirs(parent)
    else:
        try:
            os.makedirs(parent, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise NotADirectoryError(f"cannot create directory {parent}: a file is in the way") from None


def write_text_atomic(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary name, so a crash never leaves half a file."""
    make_parent_dirs(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open_file(tmp, "w") as f:
        f.write(text)
    if is_remote(path):
        import tensorflow as tf

        tf.io.gfile.rename(tmp, path, overwrite=True)
    else:
        os.replace(tmp, path)
