"""Why training stopped: the errors the Trainer raises (each message one line, which the scripts print
before exiting non-zero) and the helpers that make TensorFlow's errors into such lines."""

from __future__ import annotations

import re
from typing import Optional

import tensorflow as tf

# What a collective op raises when a peer is gone (connection reset, health check, timeout).
PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
                 tf.errors.AbortedError)


class TrainingError(RuntimeError):
    """Training cannot go on; the message is one line (scripts print it and exit non-zero)."""


class NonFiniteLossError(TrainingError):
    """Training produced a NaN/Inf loss; no checkpoint was written for it."""


class CheckpointWriteError(TrainingError):
    """A checkpoint could not be written (e.g. disk full); its partial files were removed."""


class WorkerLostError(TrainingError):
    """A peer of a multi-worker run died or became unreachable; restart every worker to resume."""


class CheckpointRestoreError(TrainingError):
    """model_dir holds checkpoints but none of them can be restored into this model."""


class TrainingPreempted(RuntimeError):
    """SIGTERM arrived; a checkpoint was saved at `step`."""

    def __init__(self, step: int, checkpoint: Optional[str]):
        super().__init__(f"SIGTERM: saved checkpoint {checkpoint} at step {step}")
        self.step = step
        self.checkpoint = checkpoint


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
