"""One dense layer at batch-1 request sizes: the int8 export's layer against ONNX Runtime's, side by side.

bench_serving.py --onnxruntime measures whole requests; this measures the piece that decides them. At
batch 1 a request is 6 dense layers per Transformer block over M = its token count (MiniLM: ~20 for a
typical sentence), and in our int8 export those layers are most of the time (a TensorFlow profile of one
MiniLM request: the _QuantizedMatMul calls are ~70% of its op time). The question this answers: how long
does one such layer take in each stack, for the arithmetic it does?

Variants (each a float32 input x [M, K] quantized per call, an int8 x int8 matmul, dequantized + bias):
  tf-int8     bert_tf.serving.quantize.Int8Dense, exactly the layer the int8 export traces (the input's
              range from a min/max reduction, QuantizeV2 to uint8, TensorFlow's oneDNN _QuantizedMatMul with
              per-column weight scales, BiasAdd and Dequantize fused)
  ort-int8    ONNX Runtime DynamicQuantizeMatMul (com.microsoft), the op its graph optimizer makes of what
              onnxruntime.quantization.quantize_dynamic writes for a MatMul: input quantized per call, MLAS
              uint8 x int8 GEMM with per-column scales, bias
  tf-fp32     the float32 layer (keras Dense, as the float export runs it: Eigen, or oneDNN where
              TensorFlow turns its oneDNN ops on)
  ort-fp32    ONNX Runtime MatMul + Add, float32 (MLAS)
  tf-int8-xla int8 x int8 -> int32 tf.matmul under jit_compile (XLA's own int8 dot), for reference
Every variant runs CALLS layers with different weights in one graph call, each on the input plus a
different constant, and returns
the sum of one column of each output; the same graph without the layers is timed too and subtracted, so
the figure is per layer with the framework's per-call overhead taken out. The graph calls take INPUTS
inputs of different ranges in turn, as requests bring new activation ranges. Weights are random, int8 in
[-64, 64] as the export writes them. Both stacks get 2 intra-op threads (ORT: its default sequential
executor). The variants take turns in random order within each round.

  pip install onnx==1.23.2 onnxruntime==1.32.0     # benchmark-only
  python benchmarks/bench_int8_kernels.py                      # MiniLM and BERT-base layers, M = 1, 20, 64
  python benchmarks/bench_int8_kernels.py --models=minilm --tokens=20 --rounds=5
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

CALLS = 12  # layers per graph call
# (hidden, intermediate) of the benchmarked models; the layers are [K, N] = [H, H] (attention query, key,
# value, output), [H, 4H] (intermediate) and [4H, H] (FFN output).
MODELS = {"minilm": (384, 1536), "base": (768, 3072)}
VARIANTS = ("tf-int8", "ort-int8", "tf-fp32", "ort-fp32", "tf-int8-xla")
THREADS = 2
INPUTS = 16


def layer_shapes(hidden, intermediate):
    return [(hidden, hidden), (hidden, intermediate), (intermediate, hidden)]


def tf_graphs(m, k, n, rng):
    """name -> (graph call, empty graph call) for the TensorFlow variants at [m, k] x [k, n]."""
    import keras
    import numpy as np
    import tensorflow as tf

    from bert_tf.serving.quantize import WEIGHT_LEVELS, Int8Dense

    xs = [tf.constant(x) for x in inputs(m, k, rng)]
    layers = []
    for _ in range(CALLS):
        layer = keras.layers.Dense(n)
        layer.build((None, k))
        layer.kernel.assign(rng.standard_normal((k, n)).astype(np.float32) * 0.05)
        layer.bias.assign(rng.standard_normal(n).astype(np.float32) * 0.05)
        layers.append(layer)
    int8 = [Int8Dense(layer) for layer in layers]
    weights_q = [tf.constant(rng.integers(-WEIGHT_LEVELS, WEIGHT_LEVELS + 1, (k, n)).astype(np.int8))
                 for _ in range(CALLS)]

    def xla_int8(h, i):
        hq = tf.cast(tf.clip_by_value(tf.round(h * 20.0), -127.0, 127.0), tf.int8)
        return tf.cast(tf.matmul(hq, weights_q[i], output_type=tf.int32), tf.float32)

    apply = {"tf-int8": lambda h, i: int8[i](h), "tf-fp32": lambda h, i: layers[i](h), "tf-int8-xla": xla_int8}

    def graph(fn, jit=False):
        @tf.function(autograph=False, jit_compile=jit)
        def run(x):
            return tf.add_n([fn(x + 0.01 * i, i)[:, :1] for i in range(CALLS)])
        feeds = iter(itertools.cycle(xs))
        return lambda: run(next(feeds)).numpy()

    empty = graph(lambda h, i: h)
    return {name: (graph(fn, jit=name.endswith("xla")), empty) for name, fn in apply.items()}


def ort_graphs(m, k, n, rng):
    """name -> (session call, empty session call) for the ONNX Runtime variants."""
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    from bert_tf.serving.quantize import WEIGHT_LEVELS

    def session(kind):
        nodes, inits, parts = [], [], []
        for i in range(CALLS):
            inits.append(numpy_helper.from_array(np.full([1], 0.01 * i, np.float32), f"c{i}"))
            nodes.append(helper.make_node("Add", ["x", f"c{i}"], [f"h{i}"]))
            if kind != "empty":
                inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32) * 0.05, f"b{i}"))
            if kind == "int8":
                inits += [numpy_helper.from_array(rng.integers(-WEIGHT_LEVELS, WEIGHT_LEVELS + 1, (k, n)).astype(np.int8), f"w{i}"),
                          numpy_helper.from_array((rng.random(n).astype(np.float32) + 0.5) / 1000, f"s{i}"),
                          numpy_helper.from_array(np.zeros(n, np.int8), f"z{i}")]
                nodes.append(helper.make_node("DynamicQuantizeMatMul", [f"h{i}", f"w{i}", f"s{i}", f"z{i}", f"b{i}"],
                                              [f"y{i}"], domain="com.microsoft"))
            elif kind == "fp32":
                inits.append(numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.05, f"w{i}"))
                nodes += [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"m{i}"]),
                          helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
            else:  # empty: the same graph without the layer
                nodes.append(helper.make_node("Identity", [f"h{i}"], [f"y{i}"]))
            nodes.append(helper.make_node("Slice", [f"y{i}", "start", "end", "axis"], [f"p{i}"]))
            parts.append(f"p{i}")
        nodes.append(helper.make_node("Sum", parts, ["out"]))
        inits += [numpy_helper.from_array(np.array([v], np.int64), name)
                  for name, v in (("start", 0), ("end", 1), ("axis", 1))]
        graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, [m, 1])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
        options.log_severity_level = 3  # errors only
        sess = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = iter(itertools.cycle(inputs(m, k, rng)))
        return lambda: sess.run(None, {"x": next(feeds)})

    empty = session("empty")
    return {"ort-int8": (session("int8"), empty), "ort-fp32": (session("fp32"), empty)}


def inputs(m, k, rng):
    """INPUTS float32 [m, k] inputs of different ranges, fed in turn: in serving every request brings new
    activation ranges (a kernel that caches per range pays for that)."""
    import numpy as np

    return [(rng.standard_normal((m, k)) * rng.uniform(0.5, 4.0)).astype(np.float32) for _ in range(INPUTS)]


def time_per_call(fn, calls):
    """Median wall seconds of fn() over `calls` calls."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="minilm,base", help=f"of {','.join(MODELS)}")
    parser.add_argument("--tokens", default="1,20,64", help="M: the request's token count")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {','.join(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=60, help="graph calls per variant and round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS)) + sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        sys.exit(f"bench_int8_kernels: unknown variant or model {', '.join(unknown)}")
    if any(v.startswith("ort") for v in variants):
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as e:
            sys.exit(f"bench_int8_kernels: the ort variants need onnx and onnxruntime ({e}); "
                     "pip install onnx==1.23.2 onnxruntime==1.32.0")
    import numpy as np
    import tensorflow as tf

    from bert_tf import env

    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    print(env.summary_line(), flush=True)
    order = random.Random(args.seed)
    rows = []
    for model in args.models.split(","):
        for k, n in layer_shapes(*MODELS[model]):
            for m in (int(t) for t in args.tokens.split(",")):
                rng = np.random.default_rng(args.seed)
                graphs = {}
                if any(v.startswith("tf") for v in variants):
                    graphs.update(tf_graphs(m, k, n, rng))
                if any(v.startswith("ort") for v in variants):
                    graphs.update(ort_graphs(m, k, n, rng))
                graphs = {v: graphs[v] for v in variants}
                for run, empty in graphs.values():  # warm-up: traces, XLA compiles, weight reorders
                    for _ in range(5):
                        run(), empty()
                per_layer = {v: [] for v in variants}
                for _ in range(args.rounds):
                    for v in order.sample(variants, len(variants)):
                        run, empty = graphs[v]
                        per_layer[v].append((time_per_call(run, args.calls) - time_per_call(empty, args.calls)) / CALLS)
                us = {v: 1e6 * float(np.median(t)) for v, t in per_layer.items()}
                rows.append((model, m, k, n, us))
                cells = "  ".join(f"{v} {us[v]:7.1f} us ({2 * m * k * n / us[v] / 1e3:6.1f} GFLOP/s)" for v in variants)
                print(f"{model:6s} M={m:3d} [{k}x{n}]  {cells}", flush=True)
    if "tf-int8" in variants and "ort-int8" in variants:
        print("\ntf-int8 / ort-int8 per layer:")
        for model, m, k, n, us in rows:
            print(f"  {model:6s} M={m:3d} [{k}x{n}]: {us['tf-int8'] / us['ort-int8']:.2f}x")


if __name__ == "__main__":
    main()
