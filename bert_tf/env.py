"""What a run has to work with: versions, CPU ISA and oneDNN, GPUs, TPU, XLA, int8/bfloat16, gs://.

  python -m bert_tf.env          # readable report
  python -m bert_tf.env --json   # the same as JSON

`report()` returns it as a dict (computed once per process); `summary_line()` is the one line
every training run logs at its start, and `report_text()` the text the Trainer writes to
TensorBoard (with the run's flags and model config). Nothing here connects to a TPU cluster
or a bucket: TPU cores are the local TPU devices TensorFlow lists, and gs:// support is
whether TensorFlow has a file system registered for the scheme.

CPU ISA: the flags of /proc/cpuinfo (Linux; "unknown" elsewhere). oneDNN, TensorFlow's x86
CPU kernel library, uses only what both the CPU and ONEDNN_MAX_CPU_ISA (if set) allow: with
ONEDNN_MAX_CPU_ISA=AVX2 it runs its AVX2 kernels even on an AMX machine. int8 serving "pays"
when oneDNN may use VNNI or AMX-INT8 (int8 dot products); bfloat16 when it may use
AVX512-BF16 or AMX-BF16.
"""

import argparse
import contextlib
import functools
import importlib.metadata
import json
import os
import platform
import shlex
import sys

from bert_tf import __version__, console

# /proc/cpuinfo flag -> the name the report uses.
ISA_FLAGS = {
    "avx2": "AVX2",
    "fma": "FMA",
    "avx512f": "AVX512F",
    "avx512_vnni": "AVX512_VNNI",
    "avx_vnni": "AVX_VNNI",
    "avx512_bf16": "AVX512_BF16",
    "amx_tile": "AMX_TILE",
    "amx_int8": "AMX_INT8",
    "amx_bf16": "AMX_BF16",
}
_BASE = {"AVX2", "FMA"}
_AVX512 = _BASE | {"AVX512F"}
_FP16 = _AVX512 | {"AVX512_VNNI", "AVX512_BF16", "AVX_VNNI"}
_AMX = _FP16 | {"AMX_TILE", "AMX_INT8", "AMX_BF16"}
# ONEDNN_MAX_CPU_ISA values (oneDNN 3.x names and their older aliases) -> the ISA_FLAGS features
# oneDNN may use under that cap.
ONEDNN_ISA_CAPS = {
    "SSE41": set(),
    "AVX": set(),
    "AVX2": _BASE,
    "AVX2_VNNI": _BASE | {"AVX_VNNI"},
    "AVX2_VNNI_2": _BASE | {"AVX_VNNI"},
    "AVX512_CORE": _AVX512,
    "AVX512_CORE_VNNI": _AVX512 | {"AVX512_VNNI"},
    "AVX512_CORE_BF16": _AVX512 | {"AVX512_VNNI", "AVX512_BF16"},
    "AVX10_1_512": _FP16,
    "AVX512_CORE_FP16": _FP16,
    "AVX10_1_512_AMX": _AMX,
    "AVX512_CORE_AMX": _AMX,
    "AVX10_1_512_AMX_FP16": _AMX,
    "AVX512_CORE_AMX_FP16": _AMX,
    "ALL": set(ISA_FLAGS.values()),
    "DEFAULT": set(ISA_FLAGS.values()),
}
INT8_FAST_ISA = ("AMX_INT8", "AVX512_VNNI", "AVX_VNNI")
BF16_FAST_ISA = ("AMX_BF16", "AVX512_BF16")


def _version(distribution: str):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    import keras
    import numpy
    import tensorflow as tf


    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "tensorflow_text": _version("tensorflow-text") or _version("tensorflow_text"),
        "numpy": numpy.__version__,
        "bert_tf": __version__,
        "platform": platform.platform(),
    }


def cpu_info(cpuinfo_path: str = "/proc/cpuinfo") -> dict:
    """CPU model, logical cores and the ISA features of ISA_FLAGS ({} when they cannot be read)."""
    model, flags = platform.processor() or platform.machine(), None
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and value.strip():
                    model = value.strip()
                elif key in ("flags", "Features") and flags is None:
                    flags = set(value.split())
                if flags is not None and key == "" and model:
                    break  # the first processor's block is enough
    except OSError:
        pass
    isa = None if flags is None else {name: flag in flags for flag, name in ISA_FLAGS.items()}
    return {"model": model, "logical_cores": os.cpu_count(), "machine": platform.machine(), "isa": isa}


def onednn_info(isa) -> dict:
    """oneDNN on/off and the CPU features it may use under ONEDNN_MAX_CPU_ISA (`isa`: cpu_info()["isa"])."""
    opts = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    try:
        from tensorflow.python.util import _pywrap_util_port

        enabled = bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # (a private API: fall back to TF 2.20's documented default)
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        default = x86 and sys.platform.startswith(("linux", "win"))
        enabled = default if opts is None else opts.strip().lower() in ("1", "true")
    cap_value = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    cap = cap_value.strip().upper() if cap_value else None
    info = {"enabled": enabled, "TF_ENABLE_ONEDNN_OPTS": opts, "ONEDNN_MAX_CPU_ISA": cap_value,
            "isa_cap": cap or "none (all the CPU has)"}
    if cap and cap not in ONEDNN_ISA_CAPS:
        info["isa_cap"] = f"{cap_value} (not an ISA name this report knows: {', '.join(ONEDNN_ISA_CAPS)})"
    allowed = ONEDNN_ISA_CAPS.get(cap, ONEDNN_ISA_CAPS["ALL"]) if cap else ONEDNN_ISA_CAPS["ALL"]
    info["isa_used"] = None if isa is None else [name for name in ISA_FLAGS.values() if isa[name] and name in allowed]
    info["isa_capped_away"] = None if isa is None else [
        name for name in ISA_FLAGS.values() if isa[name] and name not in allowed]
    return info


def _cuda_total_memory_mib():
    """Total memory of each CUDA device (driver API, CUDA ordinals); [] without a driver."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1" if sys.platform.startswith("linux") else "nvcuda.dll")
        if cuda.cuInit(0) != 0:
            return []
        count = ctypes.c_int()
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return []
        sizes = []
        for ordinal in range(count.value):
            device, size = ctypes.c_int(), ctypes.c_size_t()
            if cuda.cuDeviceGet(ctypes.byref(device), ordinal) or cuda.cuDeviceTotalMem_v2(ctypes.byref(size), device):
                return []
            sizes.append(size.value // 2**20)
        return sizes
    except (OSError, AttributeError):
        return []


def gpu_info() -> list:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    memory = _cuda_total_memory_mib() if gpus else []
    out = []
    for i, gpu in enumerate(gpus):
        try:
            details = tf.config.experimental.get_device_details(gpu)
        except (ValueError, tf.errors.OpError):
            details = {}
        capability = details.get("compute_capability")
        out.append({
            "name": gpu.name,
            "device_name": details.get("device_name"),
            "compute_capability": ".".join(map(str, capability)) if capability else None,
            "memory_mib": memory[i] if len(memory) == len(gpus) else None,
        })
    return out


def tpu_info() -> dict:
    """Local TPU devices as TensorFlow lists them (no cluster is contacted)."""
    import tensorflow as tf

    devices = tf.config.list_physical_devices("TPU")
    info = {"cores": len(devices)}
    accelerator = os.environ.get("TPU_ACCELERATOR_TYPE")
    if accelerator:
        info["accelerator_type"] = accelerator
    return info


def xla_info() -> dict:
    """Whether a tiny jit_compile function compiles and gives the right answer (on the CPU)."""
    import tensorflow as tf

    try:
        with _without_xla_notices(), tf.device("/CPU:0"):
            value = tf.function(lambda x: x * 2.0 + 1.0, jit_compile=True)(tf.constant([1.0, 2.0])).numpy()
    except Exception as e:  # (any failure means: not available here)
        return {"available": False, "detail": _first_line(e)}
    ok = value.tolist() == [3.0, 5.0]
    return {"available": ok, "detail": "a jit_compile function ran" if ok else f"wrong result {value.tolist()}"}


# What XLA's C++ code prints on its first compile whatever TF_CPP_MIN_LOG_LEVEL says.
XLA_NOTICES = ("All log messages before absl::InitializeLog()", "Compiled cluster using XLA")


@contextlib.contextmanager
def _without_xla_notices():
    """Holds back the process's stderr during the XLA probe, then writes it out again less
    XLA_NOTICES (kept under BERT_TF_VERBOSE=1)."""
    if console.verbose():
        yield
        return
    with console.stderr_without(lambda line: any(n in line for n in XLA_NOTICES)):
        yield


def int8_info(onednn: dict) -> dict:
    """Whether the int8 serving kernel runs here, and whether it is fast (VNNI / AMX-INT8 usable)."""
    import tensorflow as tf

    try:
        from bert_tf.serving import quantize  # lazy: the environment report is TensorFlow-free until asked for int8

        with tf.device("/CPU:0"):
            quantize.check_int8_runtime()
    except Exception as e:  # (ExportError, or a runtime without the op)
        return {"verdict": "unavailable", "detail": _first_line(e)}
    used = onednn.get("isa_used")
    fast = [name for name in INT8_FAST_ISA if used and name in used]
    if fast:
        return {"verdict": "fast", "detail": f"oneDNN int8 dot products with {', '.join(fast)}"}
    if used is None:
        return {"verdict": "runs", "detail": "the int8 kernel runs; the CPU's ISA is unknown"}
    capped = [name for name in INT8_FAST_ISA if name in (onednn.get("isa_capped_away") or [])]
    why = (f"{', '.join(capped)} capped away by ONEDNN_MAX_CPU_ISA={onednn['ONEDNN_MAX_CPU_ISA']}" if capped
           else "no VNNI or AMX-INT8 on this CPU")
    return {"verdict": "runs", "detail": f"the int8 kernel runs without int8 dot products ({why}): slow, "
                                         "u8 x s8 products summed in pairs in 16 bits"}


def bfloat16_info(onednn: dict) -> dict:
    used = onednn.get("isa_used")
    fast = [name for name in BF16_FAST_ISA if used and name in used]
    if fast and onednn.get("enabled"):
        return {"pays": True, "detail": f"oneDNN bfloat16 with {', '.join(fast)}"}
    if fast:
        return {"pays": False, "detail": "the CPU has bfloat16 instructions but oneDNN is off (TF_ENABLE_ONEDNN_OPTS)"}
    capped = [name for name in BF16_FAST_ISA if name in (onednn.get("isa_capped_away") or [])]
    if capped:
        # TF 2.20 picks its oneDNN bfloat16/float16 kernels by the CPU's flags, not by the cap.
        return {"pays": False, "detail": f"{', '.join(capped)} capped away by ONEDNN_MAX_CPU_ISA; TF 2.20 crashes "
                "(segfault) on bfloat16/float16 matmuls in this state: train in float32 or drop the cap"}
    return {"pays": False, "detail": "no AVX512-BF16 or AMX-BF16 on this CPU (oneDNN computes bfloat16 in float32)"
            if used is not None else "the CPU's ISA is unknown"}


def gcs_info() -> dict:
    """Whether gs:// has a registered TensorFlow file system (no request is made)."""
    import tensorflow as tf

    try:
        schemes = sorted(s for s in tf.io.gfile.get_registered_schemes() if s)
    except (AttributeError, tf.errors.OpError) as e:
        return {"gs_registered": None, "detail": _first_line(e)}
    registered = "gs" in schemes
    plugin = _version("tensorflow-io-gcs-filesystem")
    modular = os.environ.get("TF_USE_MODULAR_FILESYSTEM")
    if registered:
        detail = "credentials: `gcloud auth application-default login`, or the VM's service account"
    elif plugin:
        detail = "tensorflow-io-gcs-filesystem is installed: set TF_USE_MODULAR_FILESYSTEM=1 to use it"
    else:
        minor = ".".join(tf.__version__.split(".")[:2])  # the installed TensorFlow's release (2.20, 2.21)
        detail = f"no gs:// file system: pip install 'tensorflow[gcs-filesystem]=={minor}.*'"
    return {"gs_registered": registered, "schemes": schemes, "tensorflow_io_gcs_filesystem": plugin,
            "TF_USE_MODULAR_FILESYSTEM": modular, "detail": detail}


def _first_line(error) -> str:
    text = str(getattr(error, "message", None) or error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def _section(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # (one broken probe must not hide the rest of the report)
        return {"error": _first_line(e)}


@functools.lru_cache(maxsize=None)
def _cached_report() -> str:
    cpu = _section(cpu_info)
    onednn = _section(onednn_info, cpu.get("isa"))
    report = {
        "versions": _section(versions),
        "cpu": cpu,
        "onednn": onednn,
        "gpus": _section(gpu_info),
        "tpu": _section(tpu_info),
        "xla": _section(xla_info),
        "int8_serving": _section(int8_info, onednn),
        "bfloat16": _section(bfloat16_info, onednn),
        "gcs": _section(gcs_info),
    }
    return json.dumps(report)


def report() -> dict:
    """The whole report as a JSON-able dict (probed once per process; a fresh copy each call)."""
    return json.loads(_cached_report())


def _isa_text(cpu: dict) -> str:
    isa = cpu.get("isa")
    if isa is None:
        return "ISA unknown"
    return " ".join(name for name, present in isa.items() if present) or "none of " + " ".join(isa)


def summary_line(rep=None) -> str:
    """One line: what ran where (logged at the start of every training run)."""
    rep = rep or report()
    v, cpu, dnn = rep["versions"], rep["cpu"], rep["onednn"]
    gpus = rep["gpus"]
    gpu_text = ("none" if not gpus else "; ".join(
        f"{g.get('device_name') or g.get('name')} (cc {g.get('compute_capability')}, {g.get('memory_mib')} MiB)"
        for g in gpus)) if isinstance(gpus, list) else "unknown"
    cap = f", cap {dnn['ONEDNN_MAX_CPU_ISA']}" if dnn.get("ONEDNN_MAX_CPU_ISA") else ""
    return (
        f"env: TF {v.get('tensorflow')}, Keras {v.get('keras')}, tf-text {v.get('tensorflow_text')}, "
        f"Python {v.get('python')} | CPU {cpu.get('model')} x{cpu.get('logical_cores')} ({_isa_text(cpu)}) | "
        f"oneDNN {'on' if dnn.get('enabled') else 'off'}{cap} | GPU {gpu_text} | "
        f"TPU cores {rep['tpu'].get('cores', 'unknown')} | XLA {'yes' if rep['xla'].get('available') else 'no'} | "
        f"int8 {rep['int8_serving'].get('verdict', 'unknown')} | "
        f"bfloat16 {'pays' if rep['bfloat16'].get('pays') else 'does not pay'} | "
        f"gs:// {'yes' if rep['gcs'].get('gs_registered') else 'no'}"
    )


def report_text(rep=None) -> str:
    """The readable report (what `python -m bert_tf.env` prints)."""
    rep = rep or report()
    lines = []

    def add(title, value):
        lines.append(f"{title + ':':<16}{value}")

    v = rep["versions"]
    add("versions", ", ".join(f"{k} {val}" for k, val in v.items() if k != "platform") if "error" not in v
        else v["error"])
    add("platform", v.get("platform"))
    cpu = rep["cpu"]
    add("cpu", f"{cpu.get('model')}, {cpu.get('logical_cores')} logical cores")
    add("cpu isa", _isa_text(cpu))
    dnn = rep["onednn"]
    add("onednn", f"{'on' if dnn.get('enabled') else 'off'} (TF_ENABLE_ONEDNN_OPTS={dnn.get('TF_ENABLE_ONEDNN_OPTS')})")
    add("onednn isa cap", f"{dnn.get('isa_cap')} (ONEDNN_MAX_CPU_ISA={dnn.get('ONEDNN_MAX_CPU_ISA')})")
    if dnn.get("isa_used") is not None:
        add("onednn uses", " ".join(dnn["isa_used"]) or "none of the listed features")
    if dnn.get("isa_capped_away"):
        add("onednn skips", " ".join(dnn["isa_capped_away"]) + " (capped by ONEDNN_MAX_CPU_ISA)")
    gpus = rep["gpus"]
    if isinstance(gpus, dict):
        add("gpus", gpus.get("error"))
    elif not gpus:
        add("gpus", "none")
    for g in gpus if isinstance(gpus, list) else []:
        add("gpu", f"{g['name']}: {g.get('device_name')}, compute capability {g.get('compute_capability')}, "
                   f"{g.get('memory_mib')} MiB")
    tpu = rep["tpu"]
    add("tpu", tpu.get("error") or (f"{tpu['cores']} cores" if tpu.get("cores") else "none")
        + (f" ({tpu['accelerator_type']})" if tpu.get("accelerator_type") else ""))
    add("xla", f"{'available' if rep['xla'].get('available') else 'not available'} ({rep['xla'].get('detail')})")
    i8 = rep["int8_serving"]
    add("int8 serving", f"{i8.get('verdict')} ({i8.get('detail') or i8.get('error')})")
    bf = rep["bfloat16"]
    add("bfloat16", f"{'pays' if bf.get('pays') else 'does not pay'} ({bf.get('detail') or bf.get('error')})")
    gcs = rep["gcs"]
    add("gs://", f"{'registered' if gcs.get('gs_registered') else 'not registered'} "
                 f"({gcs.get('detail') or gcs.get('error')})")
    return "\n".join(lines)


def run_command() -> str:
    """The command line of this process, as it could be typed again."""
    return shlex.join([os.path.basename(sys.executable) or "python"] + sys.argv)


def run_flags(flag_values=None) -> dict:
    """{flag: value} of the absl flags the program defined (not absl's or TensorFlow's), once parsed; else {}."""
    from absl import flags

    flag_values = flag_values or flags.FLAGS
    if not flag_values.is_parsed():
        return {}
    values = {}
    for module, module_flags in flag_values.flags_by_module_dict().items():
        if module.split(".")[0] not in ("absl", "tensorflow", "keras", "tensorflow_text"):
            values.update({f.name: f.value for f in module_flags})
    return dict(sorted(values.items()))


def run_text(model_config: str, rep=None) -> dict:
    """{TensorBoard text tag: markdown} for a run: what ran where, how it was started, on which model."""

    def code(text):  # an indented block: markdown keeps its lines and spacing
        return "\n".join("    " + line for line in str(text).splitlines())

    flag_lines = "\n".join(f"--{k}={v}" for k, v in run_flags().items()) or "(no absl flags parsed)"
    return {
        "run/environment": code(summary_line(rep) + "\n\n" + report_text(rep)),
        "run/command": code(run_command()),
        "run/flags": code(flag_lines),
        "run/model_config": code(model_config),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_tf.env", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    rep = report()
    print(json.dumps(rep, indent=2) if args.json else report_text(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
