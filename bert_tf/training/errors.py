"""Why training stopped: the helpers that make TensorFlow's errors into the one-line TrainingError the
Trainer raises (bert_tf/errors.py: TrainingError, TrainingPreempted; the scripts print the line and exit
non-zero)."""

from __future__ import annotations

import re

import tensorflow as tf

from bert_tf.errors import TrainingError, TrainingPreempted  # noqa: F401  (kept importable from here)

# What a collective op raises when a peer is gone (connection reset, health check, timeout).
PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
                 tf.errors.AbortedError)


# The classes live in bert_tf/errors.py (the one list); these old names are kept importable.
NonFiniteLossError = CheckpointWriteError = WorkerLostError = CheckpointRestoreError = TrainingError


def peer_detail(error: BaseException) -> str:
    """The line of a collective's error that says what happened (its first line is "Graph execution error:")."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "aborted by" in line or "unavailable" in line.lower() or "deadline" in line.lower():
            return line[:200]
    return lines[0][:200] if lines else type(error).__name__


def first_line(error: BaseException) -> str:
    """The first line of an error without TensorFlow's op wrapping ({{function_node ...}}, [Op:SaveV2])."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    line = re.sub(r"\s*\[Op:\w+\].*$", "", re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line))
    return line or type(error).__name__
