"""bert_tf.serving.onnx_fusions on small hand-written graphs: what is fused gives the same outputs in ONNX
Runtime, and a chain that only looks like one (another constant, a tensor used outside it) is left as it is."""

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from bert_tf.serving.onnx_fusions import fuse  # noqa: E402

WIDTH = 8


def _model(nodes, constants, outputs=("y",)):
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in constants.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", WIDTH])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, x):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _gelu_erf(divisor):
    nodes = [helper.make_node("Div", ["x", "root2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    return _model(nodes, {"root2": divisor, "one": 1.0, "half": 0.5})


def _layer_norm(extra_output=None):
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
             helper.make_node("Sub", ["x", "mean"], ["c"]), helper.make_node("Pow", ["c", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]), helper.make_node("Add", ["var", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["sd"]), helper.make_node("Div", ["c", "sd"], ["y"])]
    return _model(nodes, {"two": 2.0, "eps": 1e-12}, ("y",) + ((extra_output,) if extra_output else ()))


X = np.random.default_rng(0).normal(0, 3, (5, WIDTH)).astype(np.float32)


def test_an_erf_gelu_becomes_one_gelu_op():
    model = _gelu_erf(math.sqrt(2.0))
    before = _run(model, X)[0]
    assert fuse(model, WIDTH) == {"Gelu": 1}
    assert [n.op_type for n in model.graph.node] == ["Gelu"] and not model.graph.initializer
    after = _run(model, X)[0]
    np.testing.assert_allclose(after, before, atol=1e-6)
    np.testing.assert_allclose(after, 0.5 * X * (1 + np.vectorize(math.erf)(X / math.sqrt(2))), atol=1e-5)


def test_a_chain_of_the_same_ops_with_another_constant_is_left_alone():
    model = _gelu_erf(1.5)
    assert fuse(model, WIDTH) == {}
    assert [n.op_type for n in model.graph.node] == ["Div", "Erf", "Add", "Mul", "Mul"]


def test_a_layer_norm_without_scale_and_shift_gets_ones_and_zeros():
    model = _layer_norm()
    before = _run(model, X)[0]
    assert fuse(model, WIDTH) == {"LayerNormalization": 1}
    [node] = model.graph.node
    assert node.op_type == "LayerNormalization" and len(node.input) == 3
    scales = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(scales[node.input[1]], np.ones(WIDTH))
    np.testing.assert_array_equal(scales[node.input[2]], np.zeros(WIDTH))
    np.testing.assert_allclose(_run(model, X)[0], before, atol=1e-5)


def test_a_layer_norm_whose_inner_tensor_is_used_elsewhere_is_left_alone():
    model = _layer_norm(extra_output="c")  # the centred input is also an output of the graph
    assert fuse(model, WIDTH) == {}
    assert len(model.graph.node) == 7
