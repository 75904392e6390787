"""XLA flags the training scripts set by default on a GPU, measured as faster there (benchmarks/RESULTS.md,
"GPU candidates"; docs/accelerators.md).

XLA reads XLA_FLAGS once, when TensorFlow's runtime starts, so a script sets them first thing
(bert_setup.setup_process), where the CUDA driver sees a GPU (xla_cache.cuda_device_count, which asks the
driver, not TensorFlow). A flag already named in XLA_FLAGS is left as the user set it: opt out with,
e.g., XLA_FLAGS=--xla_gpu_enable_cudnn_layer_norm=false. The library itself never sets them.

  --xla_gpu_enable_cudnn_layer_norm=true  LayerNorm forward and backward as cuDNN kernels instead of XLA's
                                          own fusions: BERT-base width, 4 layers, bf16, batch 256, seq 128
                                          on an H200 (2026-11-27): 1.07x on top of the whole step as one
                                          program (10,199 against 9,504-9,621 seq/s for the other flags).
"""

from __future__ import annotations

import os
import shlex
from typing import List, Optional

CUDNN_LAYER_NORM = "--xla_gpu_enable_cudnn_layer_norm=true"
GPU_DEFAULTS = (CUDNN_LAYER_NORM,)


def flag_name(flag: str) -> str:
    """'--xla_gpu_enable_cudnn_layer_norm=true' -> 'xla_gpu_enable_cudnn_layer_norm'."""
    return flag.lstrip("-").split("=", 1)[0]


def named(environ=None) -> set:
    """The flag names XLA_FLAGS sets."""
    flags = (os.environ if environ is None else environ).get("XLA_FLAGS", "")
    return {flag_name(word) for word in shlex.split(flags) if word.startswith("--")}


def apply_gpu_defaults(environ=None) -> List[str]:
    """Appends each of GPU_DEFAULTS to XLA_FLAGS unless XLA_FLAGS already names that flag; returns the flags
    added. Call it before the process starts TensorFlow's runtime, and only where a GPU will run the step."""
    environ = os.environ if environ is None else environ
    present = named(environ)
    added = [flag for flag in GPU_DEFAULTS if flag_name(flag) not in present]
    if added:
        environ["XLA_FLAGS"] = " ".join([environ.get("XLA_FLAGS", "").strip(), *added]).strip()
    return added


def in_effect(environ=None) -> Optional[str]:
    """The GPU_DEFAULTS flags' settings in XLA_FLAGS (the run summary names them), None when none is named."""
    flags = (os.environ if environ is None else environ).get("XLA_FLAGS", "")
    names = {flag_name(f) for f in GPU_DEFAULTS}
    found = [word for word in shlex.split(flags) if word.startswith("--") and flag_name(word) in names]
    return " ".join(found) or None
