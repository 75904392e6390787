"""The package's import structure, read from the source (no import runs): layers, no circles, imports at the top.

Each module of bert_tf/ sits in a layer (LAYERS, lowest first). A module imports modules of its own
layer or lower ones, never a higher one, and the imports between modules form no circle. A project
import inside a function hides the layering from a reader, so it is allowed only where it is
deliberate: a TensorFlow-free worker that must not load TensorFlow (or Beam) on import, marked on the
import's line or the line above with a `# lazy:` comment that says why.
"""

import ast
import collections

import pytest
from conftest import REPO

PACKAGE = REPO / "bert_tf"

# Lowest first. A module's layer is that of the longest prefix listed (bert_tf.models.heads -> models).
LAYERS = [
    # files, console output, the configs every layer reads, the hold on an output_dir
    ["bert_tf", "bert_tf.fileio", "bert_tf.console", "bert_tf.resources", "bert_tf.configs", "bert_tf.run_holder"],
    # text and records: no model
    ["bert_tf.tokenization", "bert_tf.tasks", "bert_tf.data", "bert_tf.layers", "bert_tf.beam.common"],
    # the Keras models
    ["bert_tf.models"],
    # model directories and checkpoint formats
    ["bert_tf.model_dir", "bert_tf.checkpoint_names", "bert_tf.checkpoints"],
    # where a run's weights come from
    ["bert_tf.pretrained"],
    # training, serving, export, batch jobs over a model
    ["bert_tf.training", "bert_tf.serving", "bert_tf.export", "bert_tf.env", "bert_tf.feature_extraction",
     "bert_tf.arrays"],
    # the runners and pipelines the scripts call
    ["bert_tf.runners", "bert_tf.beam"],
]


def _module_files():
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


MODULES = _module_files()


def layer_of(module: str) -> int:
    best, layer = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, layer = len(name), i
    return layer


def _imports(module: str):
    """[(imported module, line, inside a function, lazy comment)] of `module`'s project imports."""
    path = MODULES[module]
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                # `from bert_tf.x import y`: y when it is a module, else bert_tf.x itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names]
            for target in targets:
                while target and target not in MODULES:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    near = " ".join(lines[max(0, child.lineno - 2):child.lineno])
                    found.append((target, child.lineno, in_function, "# lazy:" in near))
            visit(child, nested)

    visit(ast.parse(source), False)
    return found


IMPORTS = {module: _imports(module) for module in MODULES}


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer_of(m) is None] == []


def test_no_import_reaches_up_a_layer():
    upward = [f"{m}:{line} imports {t} (layer {layer_of(t)} > {layer_of(m)})"
              for m, found in IMPORTS.items() for t, line, _, _ in found
              # the package's own __init__ runs first for every module: only its submodules' imports count
              if t != "bert_tf" and layer_of(t) > layer_of(m)]
    assert upward == []


def test_no_import_circles():
    graph = collections.defaultdict(set)
    for m, found in IMPORTS.items():
        for t, _, _, _ in found:
            if t != "bert_tf" and not (m == "bert_tf" or t.startswith(m + ".")):  # a package may import its parts
                graph[m].add(t)
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def connect(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            connect(v)
    assert circles == []


def test_project_imports_sit_at_the_top_unless_marked_lazy():
    hidden = [f"{m}:{line} imports {t} inside a function" for m, found in IMPORTS.items()
              for t, line, in_function, lazy in found if in_function and not lazy]
    assert hidden == []


def test_the_checks_see_what_they_check():
    """The reader finds the imports this test relies on: a check over nothing would pass."""
    runners = {t for t, _, _, _ in IMPORTS["bert_tf.runners.common"]}
    assert "bert_tf.training.loop" in runners
    assert layer_of("bert_tf.models.heads") == 2 and layer_of("bert_tf.runners.squad") == len(LAYERS) - 1
    assert sum(len(found) for found in IMPORTS.values()) > 150


@pytest.mark.parametrize("module", ["bert_tf.tokenization", "bert_tf.data.pretraining_job", "bert_tf.tasks.glue",
                                    "bert_tf.beam.pretraining", "bert_tf.tokenization.vocab_builder",
                                    "bert_tf.training.settings", "bert_tf.runners.pretraining_config"])
def test_tensorflow_free_modules_import_no_tensorflow(module):
    """The data workers and the vocab builder run without TensorFlow: importing them loads none."""
    import subprocess
    import sys

    if module.startswith("bert_tf.beam."):
        pytest.importorskip("apache_beam")  # the beam extra (absent from the second TensorFlow's venv)

    code = f"import sys, {module}; assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorflow' in m)[:3]"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-400:]
