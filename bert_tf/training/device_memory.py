"""Out of device memory in one line: what did not fit, and the flags that make it fit.

A batch too large for the GPU's (or TPU core's, or the host's) memory surfaces from TensorFlow as
`ResourceExhaustedError` with a page of allocator state; under XLA it can also come from compiling
the step (an `InternalError` whose text says RESOURCE_EXHAUSTED, e.g. when autotuning cannot get a
workspace). Fine-tuning (bert_tf.runners.common) and pretraining (bert_tf.runners.pretraining) turn
either into `OutOfDeviceMemory`, a TrainingError the scripts print as their one `error:` line. It is
raised before the run's first checkpoint, so output_dir keeps what it held (the side files are written
just before that save).
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from bert_tf.errors import OutOfDeviceMemory

# How TensorFlow and XLA spell an allocation that failed, where the error's type does not say it.
OUT_OF_MEMORY_TEXT = ("RESOURCE_EXHAUSTED", "Out of memory", "OOM when allocating")


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, tf.errors.ResourceExhaustedError):
        return True
    return isinstance(error, tf.errors.OpError) and any(t in str(error) for t in OUT_OF_MEMORY_TEXT)


# The flags that shrink what one phase holds at once.
PHASE_FLAGS = {
    "training": "--train_batch_size, --gradient_accumulation_steps (the same batch in micro-batches) or --mixed_precision",
    "prediction": "--eval_batch_size / --predict_batch_size or --mixed_precision",
    "evaluation": "--eval_batch_size or --mixed_precision",
}


@contextlib.contextmanager
def one_line_when_out_of_memory(phase: str, *, batch_per_replica: int, seq_length: int, precision: str,
                                device: str, unit: str = "examples"):
    """Runs the block; an out-of-memory error in it becomes OutOfDeviceMemory (one line).

    phase: a PHASE_FLAGS key, whose flags the line names."""
    try:
        yield
    except tf.errors.OpError as e:
        if not is_out_of_memory(e):
            raise
        lower = "" if precision != "float32" else " (bfloat16; float16 on GPUs without bfloat16)"
        raise OutOfDeviceMemory(
            f"out of device memory in {phase} on {device}: a batch of {batch_per_replica} {unit} per replica x "
            f"{seq_length} tokens in {precision} does not fit; lower it with {PHASE_FLAGS[phase]}{lower}") from None


def device_name(strategy: tf.distribute.Strategy) -> str:
    """The device a replica runs on, as TensorFlow names it ("GPU:0", "CPU:0"), and how many replicas."""
    devices = strategy.extended.worker_devices
    name = devices[0].rsplit("device:", 1)[-1]
    return name if len(devices) == 1 else f"{name} and {len(devices) - 1} more replica device(s)"


__all__ = ["PHASE_FLAGS", "OutOfDeviceMemory", "device_name", "is_out_of_memory", "one_line_when_out_of_memory"]
