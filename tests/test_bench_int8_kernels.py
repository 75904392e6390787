"""benchmarks/bench_int8_kernels.py: its TensorFlow variants compute the layer they claim to time."""

import numpy as np
from conftest import benchmark_module


def test_the_int8_variant_is_the_float_layer_in_int8_and_the_empty_graph_has_no_layer():
    bench = benchmark_module("bench_int8_kernels")
    m, k, n = 5, 48, 24
    rng = np.random.default_rng(3)
    graphs = bench.tf_graphs(m, k, n, rng)
    assert set(graphs) == {"tf-int8", "tf-fp32", "tf-int8-xla"}
    rng = np.random.default_rng(3)
    x = bench.inputs(m, k, rng)[0]  # the first input every graph is fed
    fp32, empty = graphs["tf-fp32"][0](), graphs["tf-fp32"][1]()
    int8 = graphs["tf-int8"][0]()
    assert fp32.shape == int8.shape == empty.shape == (m, 1)
    # The empty graph: the same inputs and sum of one column, no layer.
    np.testing.assert_allclose(empty[:, 0], sum(x[:, 0] + 0.01 * i for i in range(bench.CALLS)), rtol=1e-5)
    # The int8 layers are the float32 layers' weights in int8 (bert_tf.serving.quantize.Int8Dense): the
    # same sums within int8 rounding, far from the float sums of other weights.
    scale = np.abs(fp32).max()
    assert np.abs(int8 - fp32).max() < 0.03 * scale
    assert np.abs(empty - fp32).max() > 0.3 * scale
