"""Where a training step's time goes: a profiler trace summarised by kernel class.

Reads either
  a TensorFlow profile: the `*.xplane.pb` that `--profile_steps` (TrainSettings.profile_steps) or
    tf.profiler.experimental.start/stop writes under <logdir>/plugins/profile/<time>/ (give the file or
    any folder above it; the newest one is read), or
  a Chrome trace (`.json` / `.json.gz`), as torch.profiler's export_chrome_trace writes,
and prints, per kernel class, the device time, its share of the traced span, and the kernel count:

  matmul        GEMMs: cuBLAS / cuBLASLt (gemm, nvjet, cutlass, xmma), XLA dots, oneDNN / Eigen MatMul,
                aten mm / bmm / addmm, torch.compile's matmul templates; attention's score and
                context products too, unless a fused attention kernel holds them
  attention     fused attention kernels (flash, fmha, cuDNN SDPA, memory-efficient attention) and softmax
  elementwise   elementwise and normalisation kernels: XLA fusions, LayerNorm, GELU, dropout, bias adds,
                casts, reductions, loss, triton pointwise / reduction kernels
  optimizer     the update and clipping: Adam / AdamW / LAMB kernels, multi-tensor applies, global-norm
  copies        copies and layout changes: memcpy / memset (host <-> device too), transposes, concats,
                slices, gathers / scatters, pads
  other         anything else (the largest are listed)
  idle          the traced span (first kernel start to last kernel end) during which no kernel ran

What counts as a kernel: on a GPU the kernels and memcpys of its streams (TensorFlow: the device
plane's "Stream #" lines; Chrome traces: the "kernel", "gpu_memcpy" and "gpu_memset" events). A
trace with no device activity (a CPU run) is summarised from its host ops instead (TensorFlow ops
of the executor threads; torch.profiler's "cpu_op" events), by self time (a nested op's time is
its own, not its parent's); idle is then the time no op ran on any thread. A kernel's class comes
from its name, then (XLA fusions, whose names say little) from the TensorFlow op it was compiled
from (the `tf_op` / `hlo_op` stats).

  python benchmarks/trace_summary.py model_dir/train/plugins/profile            # ours, --profile_steps
  python benchmarks/trace_summary.py hf_trace.json --steps=5                    # per-step milliseconds
  python benchmarks/trace_summary.py a/plugins/profile b.json --json            # side by side, as JSON
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import sys

CLASSES = ("matmul", "attention", "elementwise", "optimizer", "copies", "other")
_ELEMENTWISE_OPS = ("add|addn|mul|sub|div|realdiv|divnonan|neg|exp|log|tanh|erf|erfc|relu|sqrt|rsqrt|square|"
                    "squareddifference|pow|reciprocal|cast|convert|select|where|reduce|sum|mean|max|min|maximum|"
                    "minimum|biasadd|bias|l2loss|random|rng|philox|bernoulli|uniform|fill|zeros|ones|equal|notequal|"
                    "greater|greaterequal|less|lessequal|argmax|cumsum|clip|clamp|floormod|floordiv|bitwiseand|"
                    "logicaland|logicalor|logicalnot|compare|and|or|not")
# Checked in order against a kernel's name first (lower-cased); the first match wins.
_BY_NAME = (
    ("other", r"variableop|tensorlist|timestamp|bitcast|^call(\.\d+)?$"),  # bookkeeping and XLA's call wrappers
    ("attention", r"flash|fmha|sdpa|scaled_dot_product|efficient_attention|_attn|attention_kernel"),
    ("optimizer", r"adam|lamb|multi_tensor_apply|foreach|apply_?gradient|resourceapply|clip_grad|global_norm"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|matmul|einsum|(^|[^a-z])(dot|bmm|mm|addmm|baddbmm|linear)($|[^a-z])"),
    ("elementwise", r"cross_?entropy|log_?softmax|nll_loss"),  # the loss, not attention's softmax
    ("copies", r"memcpy|memset|copy|transpose|permute|concat|(^|[^a-z])cat($|[^a-z])|slice|gather|scatter|segment|"
               r"(^|[^a-z])(pad|pack|unpack|tile|reshape|t|expand|as_strided)($|[^a-z])|contiguous|index|dynamic_update|"
               r"broadcast_to"),
    ("attention", r"softmax"),
    ("elementwise", r"norm|gelu|dropout|elementwise|fusion|triton_(poi|per|red)|"
                    rf"(^|[^a-z])({_ELEMENTWISE_OPS})(v\d)?(grad)?($|[^a-z])"),
)
# The op or XLA program a kernel came from (an XLA fusion's name says little of what it computes).
_BY_OP = (
    ("optimizer", r"adam|lamb|optimizer|apply_gradients|global_norm|clip|_scaled_update|group_update"),
    ("elementwise", r"cross_?entropy|log_?softmax"),
    ("attention", r"softmax"),
)


def _first(rules, text):
    return next((cls for cls, pattern in rules if re.search(pattern, text)), None)


def classify(name: str, op: str = "") -> str:
    """The kernel class (CLASSES) of a kernel or op `name`, compiled from op / XLA program `op` (or ''):
    by name; an elementwise kernel, copy or variable write of the optimizer's ops is the update's."""
    text = name.lower()
    found = _first(_BY_NAME, text)
    if op and (found in (None, "elementwise", "copies") or "variableop" in text):
        by_op = _first(_BY_OP, op.lower())
        if by_op is not None:
            return by_op
    if found is None and op:
        found = _first(_BY_NAME[1:], op.lower())
    return found or "other"


# ---------------------------------------------------------------------------- reading traces
# An event: (thread key, start us, duration us, name, op) where op is the TensorFlow op it came from.


def find_trace(path: str) -> str:
    """A trace file: `path` itself, or the newest *.xplane.pb / *trace.json(.gz) under the folder."""
    if os.path.isfile(path):
        return path
    found = [p for pattern in ("*.xplane.pb", "*.json", "*.json.gz")
             for p in glob.glob(os.path.join(path, "**", pattern), recursive=True)]
    if not found:
        raise FileNotFoundError(f"{path}: no *.xplane.pb or Chrome trace (.json, .json.gz) under it")
    return max(found, key=os.path.getmtime)


def read_xplane(path: str):
    """(device kernels, host ops) of a TensorFlow XSpace: the GPU planes' stream lines, and the host
    plane's TensorFlow op events (those with an op type: 'scope/name:Type')."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    device, host = [], []
    for plane in space.planes:
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        on_device = plane.name.startswith("/device:GPU")
        if not (on_device or plane.name == "/host:CPU"):
            continue
        for line in plane.lines:
            if on_device and not line.name.startswith("Stream #"):
                continue  # derived lines (XLA Modules / Ops, TensorFlow Ops, Steps) repeat the streams' time
            base_ps = line.timestamp_ns * 1000
            for event in line.events:
                meta = plane.event_metadata[event.metadata_id]
                stats = {}
                for stat in list(event.stats) + list(meta.stats):
                    key = stat_names.get(stat.metadata_id)
                    if key in ("tf_op", "hlo_op", "hlo_module") and key not in stats:
                        stats[key] = stat.str_value or stat_names.get(stat.ref_value, "")
                if on_device:  # a kernel: its name, and the op and XLA program it came from
                    name, op = meta.name, " ".join(filter(None, (stats.get("tf_op"), stats.get("hlo_module"))))
                elif meta.display_name and not meta.name.startswith("Iterator::"):
                    name, op = meta.display_name, meta.name  # a TensorFlow op 'scope/name:Type': classed by type
                elif stats.get("hlo_op"):
                    name, op = stats["hlo_op"], stats.get("hlo_module", "")  # a kernel of an XLA CPU program
                else:
                    continue  # the executor's own regions, tf.data's, Python's
                record = ((plane.name, line.id), (base_ps + event.offset_ps) / 1e6, event.duration_ps / 1e6, name, op)
                (device if on_device else host).append(record)
    return device, host


def read_chrome(path: str):
    """(device kernels, host ops) of a Chrome trace (torch.profiler's export_chrome_trace)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    device, host = [], []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        record = ((e.get("pid"), e.get("tid")), float(e["ts"]), float(e["dur"]), str(e.get("name", "")), "")
        category = str(e.get("cat", "")).lower()
        if category in ("kernel", "gpu_memcpy", "gpu_memset"):
            device.append(record)
        elif category == "cpu_op":
            host.append(record)
    return device, host


# ---------------------------------------------------------------------------- summarising
def self_times(events):
    """Each event with its self time: its duration less that of the events nested directly in it on
    its own thread (a parent op's time is not counted twice)."""
    out = []
    by_thread = {}
    for e in events:
        by_thread.setdefault(e[0], []).append(e)
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e[1], -e[2]))
        stack = []  # [event, child time]
        for e in thread_events:
            while stack and e[1] >= stack[-1][0][1] + stack[-1][0][2]:
                done, children = stack.pop()
                out.append((done, max(done[2] - children, 0.0)))
            if stack:
                stack[-1][1] += e[2]
            stack.append([e, 0.0])
        out.extend((done, max(done[2] - children, 0.0)) for done, children in stack)
    return out


def busy_time(events) -> float:
    """The time at least one of the events runs (the union of their intervals)."""
    total, end = 0.0, None
    for _, start, duration, *_ in sorted(events, key=lambda e: e[1]):
        stop = start + duration
        if end is None or start > end:
            total += duration
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def summarise(path: str, steps: int = 1, top: int = 5) -> dict:
    """{label (the name of `path`), source (the trace file), where, span_us, classes: {class: {us, share, kernels, top: [[name, us]]}}, idle_us, idle_share},
    times per step when `steps` > 1."""
    trace = find_trace(path)
    device, host = read_xplane(trace) if trace.endswith(".pb") else read_chrome(trace)
    events, where = (device, "device") if device else (host, "host ops")
    if not events:
        raise ValueError(f"{trace}: no device kernels and no host ops in the trace")
    span = max(e[1] + e[2] for e in events) - min(e[1] for e in events)
    busy = busy_time(events)
    classes = {c: dict(us=0.0, kernels=0, names={}) for c in CLASSES}
    for e, own in self_times(events):
        entry = classes[classify(e[3], e[4])]
        entry["us"] += own
        entry["kernels"] += 1
        entry["names"][e[3]] = entry["names"].get(e[3], 0.0) + own
    out = {}
    for c, entry in classes.items():
        names = sorted(entry.pop("names").items(), key=lambda kv: -kv[1])[:top]
        out[c] = dict(us=entry["us"] / steps, share=entry["us"] / span if span else 0.0, kernels=entry["kernels"],
                      top=[[n, t / steps] for n, t in names])
    return dict(label=os.path.basename(os.path.normpath(path)), source=trace, where=where, steps=steps, span_us=span / steps, classes=out,
                idle_us=(span - busy) / steps, idle_share=(span - busy) / span if span else 0.0)


def format_summaries(summaries) -> str:
    """The summaries side by side: one row per class, milliseconds and share of the span per trace."""
    head = f"{'class':12s}" + "".join(f" {s['label'][-22:]:>22s}" for s in summaries)
    lines = [head, f"{'':12s}" + "".join(f" {'ms (' + s['where'] + ')':>14s} {'share':>7s}" for s in summaries)]
    for c in (*CLASSES, "idle"):
        cells = []
        for s in summaries:
            us, share = (s["idle_us"], s["idle_share"]) if c == "idle" else (s["classes"][c]["us"], s["classes"][c]["share"])
            cells.append(f" {us / 1000:14.3f} {100 * share:6.1f}%")
        lines.append(f"{c:12s}" + "".join(cells))
    lines.append(f"{'span':12s}" + "".join(f" {s['span_us'] / 1000:14.3f} {'':7s}" for s in summaries))
    for s in summaries:
        lines.append(f"\n{s['source']} (per step of {s['steps']}): largest kernels")
        for c in CLASSES:
            for name, us in s["classes"][c]["top"][:3]:
                lines.append(f"  {c:11s} {us / 1000:9.3f} ms  {name[:110]}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="TensorFlow profile (xplane.pb or a folder above it) or Chrome trace")
    parser.add_argument("--steps", type=int, default=1, help="steps the trace holds: times are given per step")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = parser.parse_args(argv)
    if args.steps <= 0:
        parser.error(f"--steps must be positive, got {args.steps}")
    try:
        summaries = [summarise(path, args.steps) for path in args.traces]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"trace_summary: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    print(json.dumps(summaries, indent=1) if args.json else format_summaries(summaries))


if __name__ == "__main__":
    main()
