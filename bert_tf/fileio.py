"""Files on local disk or remote file systems (gs://, s3://, hdfs://) through one small API.

Local paths use plain Python, so tools that never need TensorFlow (the data
workers, the vocab builder) do not pay its import time and ~800 MB of memory;
remote paths go through `tf.io.gfile`.
"""

import os


def is_remote(path: str) -> bool:
    return "://" in str(path)


def exists(path: str) -> bool:
    if is_remote(path):
        import tensorflow as tf

        return tf.io.gfile.exists(path)
    return os.path.exists(path)


def open_file(path: str, mode: str = "r"):
    """A file object for `path`; text modes read and write UTF-8."""
    if is_remote(path):
        import tensorflow as tf

        return tf.io.gfile.GFile(path, mode)
    return open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def write_text_atomic(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary name, so a crash never leaves half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open_file(tmp, "w") as f:
        f.write(text)
    if is_remote(path):
        import tensorflow as tf

        tf.io.gfile.rename(tmp, path, overwrite=True)
    else:
        os.replace(tmp, path)
