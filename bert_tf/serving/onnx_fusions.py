"""ONNX Runtime's fused CPU ops in place of the op chains tf2onnx writes for our encoder (the ONNX export's
`fusions`).

When it loads a model, ONNX Runtime fuses LayerNorm and GELU only where the graph has the exact op patterns
its fusers know (those of PyTorch's exporter); tf2onnx's graph of our model has other ones, so ONNX Runtime
ran ours op by op: GELU as 5-8 elementwise ops, a LayerNorm whose scale and shift tf2onnx had folded away (a
freshly initialised model: 1 and 0) or that it did not fuse itself as 7. This pass finds the chains by their
structure and writes one op each:

  LayerNormalization (ONNX opset 17)   mean, centre, square, mean, + epsilon, sqrt, divide [, * gamma][, + beta]
  FastGelu / Gelu (com.microsoft)      a subgraph of one input that computes the tanh (FastGelu) or the erf
                                       (Gelu) form of GELU, checked by evaluating it on [-8, 8]

Not fused: a residual sum into its LayerNorm (com.microsoft SkipLayerNormalization). Tried, it was slower on
the packed [tokens, hidden] rows of our export than the Add and LayerNormalization it replaced (MiniLM int8,
2-core Xeon: batch 32 ~15% fewer texts/s, 2026-11-27).

Every replacement is checked before it is made: each removed tensor is used only inside its chain, and the
GELU candidates are evaluated numerically, so a chain of another shape is left as it is. The ops are in
ONNX Runtime's CPU provider; other runtimes would need them (the export's metadata names the fusions).
"""

from __future__ import annotations

import collections
import math
from typing import Dict, Optional

import numpy as np

MICROSOFT = "com.microsoft"
# The elementwise ops a GELU chain may use (besides Tanh / Erf).
_ELEMENTWISE = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
                "Pow": np.power, "Sqrt": np.sqrt, "Tanh": np.tanh}
_GELU_GRID = np.linspace(-8.0, 8.0, 161)
# The most ops a GELU has after its Tanh / Erf (ours: + 1, * 0.5x; others add a multiply or two).
GELU_OPS_AFTER_CORE = 6


def _erf(x):
    return np.vectorize(math.erf)(x)


def gelu_erf(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class _Graph:
    """Lookups over a GraphProto: constants, each tensor's producer and consumers, ranks."""

    def __init__(self, model):
        import onnx
        from onnx import numpy_helper

        self.graph = model.graph
        self.const: Dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in self.graph.initializer}
        for node in self.graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.const[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.outputs = {o.name for o in self.graph.output}
        self.refresh()
        # Ranks and sizes, inferred once: a fused op keeps the name of the chain's output.
        inferred = onnx.shape_inference.infer_shapes(model).graph
        self.shapes = {}
        for info in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
            tensor = info.type.tensor_type
            if tensor.HasField("shape"):
                self.shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]

    def refresh(self):
        """The producer and consumer maps, and each node's index, after the node list changed."""
        self.producer = {out: node for node in self.graph.node for out in node.output}
        self.consumers = collections.defaultdict(list)
        for node in self.graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.order = {id(node): i for i, node in enumerate(self.graph.node)}

    def rewrite(self, replacements) -> None:
        """replacements: [(nodes, new node)]; each new node goes where the last of its nodes was."""
        removed = {id(n) for nodes, _ in replacements for n in nodes}
        at = collections.defaultdict(list)
        for nodes, node in replacements:
            at[max(self.order[id(n)] for n in nodes)].append(node)
        kept = []
        for index, node in enumerate(self.graph.node):
            if id(node) not in removed:
                kept.append(node)
            kept.extend(at.get(index, ()))
        del self.graph.node[:]
        self.graph.node.extend(kept)
        self.refresh()

    def drop_unused_constants(self) -> None:
        used = {name for node in self.graph.node for name in node.input} | self.outputs
        kept = [t for t in self.graph.initializer if t.name in used]
        if len(kept) < len(self.graph.initializer):
            del self.graph.initializer[:]
            self.graph.initializer.extend(kept)

    def scalar(self, name) -> Optional[float]:
        value = self.const.get(name)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    def node_of(self, name, op_type):
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def used_only_by(self, name, nodes) -> bool:
        ids = {id(n) for n in nodes}
        return name not in self.outputs and all(id(c) in ids for c in self.consumers[name])

    def other_input(self, node, name):
        """The input of a two-input node that is not `name` (None when both are)."""
        rest = [i for i in node.input if i != name]
        return rest[0] if len(rest) == 1 else None

    def sole_consumer(self, name, op_type):
        users = self.consumers[name]
        return users[0] if len(users) == 1 and users[0].op_type == op_type and name not in self.outputs else None


def _is_last_axis_mean(g: _Graph, node, x) -> bool:
    rank = len(g.shapes.get(x, [])) or None
    if node.op_type == "GlobalAveragePool":  # the mean over the axes after the first two: the last, at rank 3
        return rank == 3
    if node.op_type != "ReduceMean" or len(node.input) != 1:
        return False
    attrs = {a.name: a for a in node.attribute}
    axes = list(attrs["axes"].ints) if "axes" in attrs else None
    keep = attrs["keepdims"].i if "keepdims" in attrs else 1
    return keep == 1 and axes is not None and (axes == [-1] or (rank is not None and axes == [rank - 1]))


def _match_layer_norm(g: _Graph, div):
    """div = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps): (x, eps, chain nodes, gamma, beta, output)."""
    if div.op_type != "Div":
        return None
    sub, sqrt = g.node_of(div.input[0], "Sub"), g.node_of(div.input[1], "Sqrt")
    plus = sqrt and g.node_of(sqrt.input[0], "Add")
    if not (sub and plus):
        return None
    eps = next((g.scalar(i) for i in plus.input if g.scalar(i) is not None), None)
    var = g.producer.get(g.other_input(plus, next(i for i in plus.input if i in g.const))) if eps is not None else None
    square = var is not None and g.node_of(var.input[0], "Pow")
    x, centre = sub.input
    mean = g.producer.get(centre)
    if not (square and mean and square.input[0] == div.input[0] and g.scalar(square.input[1]) == 2.0
            and mean.input[0] == x and _is_last_axis_mean(g, mean, x) and _is_last_axis_mean(g, var, x)):
        return None
    nodes = [mean, sub, square, var, plus, sqrt, div]
    out, gamma, beta = div.output[0], None, None
    scale = g.sole_consumer(out, "Mul")
    if scale is not None and g.other_input(scale, out) in g.const:
        gamma, out = g.other_input(scale, out), scale.output[0]
        nodes.append(scale)
    shift = g.sole_consumer(out, "Add")
    if shift is not None and g.other_input(shift, out) in g.const:
        beta, out = g.other_input(shift, out), shift.output[0]
        nodes.append(shift)
    inside = [centre, sub.output[0], square.output[0], var.output[0], plus.output[0], sqrt.output[0]] + \
        [n.input[0] for n in nodes[7:]]
    if not all(g.used_only_by(name, nodes) for name in inside):
        return None
    return x, eps, nodes, gamma, beta, out


def _evaluate(g: _Graph, nodes, x_name, x):
    """The chain `nodes` (in graph order) on x; None if it uses anything but x, constants and itself."""
    values = {x_name: x}
    for node in nodes:
        args = []
        for name in node.input:
            if name in values:
                args.append(values[name])
            elif name in g.const:
                args.append(g.const[name].astype(np.float64))
            else:
                return None
        fn = _erf if node.op_type == "Erf" else _ELEMENTWISE.get(node.op_type)
        if fn is None:
            return None
        values[node.output[0]] = fn(*args)
    return values[nodes[-1].output[0]]


def _match_gelu(g: _Graph, core):
    """A Tanh / Erf node inside a GELU of one input: (x, "FastGelu" or "Gelu", nodes, output)."""
    # x: the one tensor the chain into `core` starts from: inside a GELU every tensor but x has one user.
    chain, frontier, sources = [core], [core], set()
    while frontier:
        node = frontier.pop()
        for name in node.input:
            parent = g.producer.get(name)
            if name in g.const:
                continue
            if parent is None or parent.op_type not in _ELEMENTWISE or len(g.consumers[name]) > 1:
                sources.add(name)
            elif all(parent is not n for n in chain):
                chain.append(parent)
                frontier.append(parent)
    if len(sources) != 1:
        return None
    [x] = sources
    # Forward from the core through elementwise ops until the chain computes a GELU of x.
    node = core
    for _ in range(GELU_OPS_AFTER_CORE):
        users = g.consumers[node.output[0]]
        if len(users) != 1 or users[0].op_type not in _ELEMENTWISE:
            return None
        node = users[0]
        chain.append(node)
        for name in node.input:  # the other operand's own elementwise chain from x (e.g. 0.5 * x)
            parent = g.producer.get(name)
            if parent is not None and all(parent is not n for n in chain) and parent.op_type in _ELEMENTWISE and \
                    all(i == x or i in g.const for i in parent.input):
                chain.append(parent)
        nodes = sorted(chain, key=lambda n: g.order[id(n)])
        result = _evaluate(g, nodes, x, _GELU_GRID)
        if result is None:
            continue
        for op, reference in (("FastGelu", gelu_tanh), ("Gelu", gelu_erf)):
            if np.allclose(result, reference(_GELU_GRID), atol=1e-5, rtol=1e-5) and \
                    all(g.used_only_by(n.output[0], nodes) for n in nodes if n is not node):
                return x, op, nodes, node.output[0]
    return None


def fuse(model, hidden_size: int) -> Dict[str, int]:
    """Rewrites `model` (an onnx ModelProto) in place; returns {fused op: count}. hidden_size: the width of a
    LayerNorm whose scale and shift were folded away, where shape inference does not say it."""
    from onnx import helper, numpy_helper

    g = _Graph(model)
    counts = collections.Counter()

    def ones_and_zeros(name, width):
        for suffix, value in (("gamma", np.ones(width, np.float32)), ("beta", np.zeros(width, np.float32))):
            g.graph.initializer.append(numpy_helper.from_array(value, f"{name}/fused_{suffix}"))
            g.const[f"{name}/fused_{suffix}"] = value
        return f"{name}/fused_gamma", f"{name}/fused_beta"

    # 1. LayerNorm chains -> LayerNormalization.
    replacements = []
    for node in g.graph.node:
        found = _match_layer_norm(g, node)
        if found is not None:
            x, eps, nodes, gamma, beta, out = found
            name = nodes[-1].name or out
            if gamma is None or beta is None:
                default_gamma, default_beta = ones_and_zeros(name, (g.shapes.get(x) or [None])[-1] or hidden_size)
                gamma, beta = gamma or default_gamma, beta or default_beta
            replacements.append((nodes, helper.make_node("LayerNormalization", [x, gamma, beta], [out],
                                                         name=f"{name}/LayerNorm", axis=-1, epsilon=eps)))
    g.rewrite(replacements)
    counts["LayerNormalization"] = len(replacements)
    # 2. GELU -> FastGelu (tanh form) or Gelu (erf form).
    replacements, taken = [], set()
    for node in g.graph.node:
        if node.op_type in ("Tanh", "Erf") and id(node) not in taken:
            found = _match_gelu(g, node)
            if found is not None and not any(id(n) in taken for n in found[2]):
                x, op, nodes, out = found
                taken.update(id(n) for n in nodes)
                replacements.append((nodes, helper.make_node(op, [x], [out], name=f"{nodes[-1].name or out}/{op}",
                                                             domain=MICROSOFT)))
                counts[op] += 1
    g.rewrite(replacements)
    g.drop_unused_constants()
    if any(counts.values()) and not any(o.domain == MICROSOFT for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT, 1))
    return {op: n for op, n in counts.items() if n}
