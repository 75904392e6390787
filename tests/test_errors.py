"""bert_tf/errors.py is the one list of what can go wrong: every exception class of the library and the
scripts is defined there (an AST scan of the tree finds any other), it imports without TensorFlow, and
the names the modules raised before stay importable from them as the concern class that replaced them."""

import ast
import builtins
import importlib
import os
import subprocess
import sys

import pytest
from conftest import REPO

from bert_tf import errors
from bert_tf.errors import (
    ONE_LINE_ERRORS,
    BertError,
    CheckpointError,
    ConfigError,
    ExportError,
    InputDataError,
    OutOfDeviceMemory,
    OutputDirHeld,
    RemotePathError,
    TrainingError,
    TrainingPreempted,
)

# (module, old name, the class it is now): the public names of before this list existed.
OLD_NAMES = [
    ("bert_tf.configs", "ConfigError", ConfigError),
    ("bert_tf.configs", "CasingMismatchError", ConfigError),
    ("bert_tf.training.strategy", "StrategyError", ConfigError),
    ("bert_tf.pretrained", "FinetuneError", ConfigError),
    ("bert_tf.runners.pretraining_config", "PretrainingError", ConfigError),
    ("bert_tf.data.pipelines", "InputDataError", InputDataError),
    ("bert_tf.data.text_input", "InputError", InputDataError),
    ("bert_tf.tasks", "TaskDataError", InputDataError),
    ("bert_tf.data.masking", "MaskingError", InputDataError),
    ("bert_tf.data.pretraining_job", "PretrainingDataError", InputDataError),
    ("bert_tf.tokenization", "VocabError", InputDataError),
    ("bert_tf.tokenization.full", "VocabError", InputDataError),
    ("bert_tf.tokenization.vocab_builder", "VocabExtensionError", InputDataError),
    ("bert_tf.beam.common", "BeamJobError", InputDataError),
    ("bert_tf.checkpoints", "CheckpointError", CheckpointError),
    ("bert_tf.model_dir", "ModelDirError", CheckpointError),
    ("bert_tf.export", "ExportError", ExportError),
    ("bert_tf.serving.module", "ServingOptionsError", ExportError),
    ("bert_tf.serving.onnx_export", "OnnxExportError", ExportError),
    ("bert_tf.serving.quantize", "QuantizationError", ExportError),
    ("bert_tf.serving.predictor", "PredictError", ExportError),
    ("bert_tf.run_holder", "OutputDirHeld", OutputDirHeld),
    ("bert_tf.fileio", "RemotePathError", RemotePathError),
    ("bert_tf.training.errors", "TrainingError", TrainingError),
    ("bert_tf.training.errors", "NonFiniteLossError", TrainingError),
    ("bert_tf.training.errors", "CheckpointWriteError", TrainingError),
    ("bert_tf.training.errors", "WorkerLostError", TrainingError),
    ("bert_tf.training.errors", "CheckpointRestoreError", TrainingError),
    ("bert_tf.training.errors", "TrainingPreempted", TrainingPreempted),
    ("bert_tf.training.device_memory", "OutOfDeviceMemory", OutOfDeviceMemory),
]


def test_errors_module_imports_without_tensorflow():
    code = ("import sys; import bert_tf.errors; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'numpy')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def _python_files():
    yield from sorted(REPO.glob("*.py"))
    yield from sorted((REPO / "bert_tf").rglob("*.py"))


def _exception_classes():
    """(file relative to the repo, class name) of every class in bert_tf/ and the top-level scripts that
    derives from an exception: a built-in one, one named *Error/*Exception (tf.errors.OpError, ...), or
    (to a fixed point) another class found here."""
    classes = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                classes.append((str(path.relative_to(REPO)), node.name, bases))

    def builtin_exception(name):
        value = getattr(builtins, name, None)
        return isinstance(value, type) and issubclass(value, BaseException)

    found = {name for _, name, bases in classes
             if any(builtin_exception(b) or b.endswith(("Error", "Exception")) for b in bases)}
    while True:
        more = {name for _, name, bases in classes if bases & found} - found
        if not more:
            break
        found |= more
    return {(path, name) for path, name, _ in classes if name in found}


def test_every_exception_class_is_defined_in_errors_py():
    found = _exception_classes()
    scattered = sorted(f"{path}: class {name}" for path, name in found if path != os.path.join("bert_tf", "errors.py"))
    assert scattered == [], "define these in bert_tf/errors.py (an old name can stay as an alias)"
    # the scan sees errors.py's own classes, and each says when it is raised
    in_errors = {name for _, name in found}
    assert in_errors == {"BertError", "ConfigError", "InputDataError", "CheckpointError", "ExportError",
                         "OutputDirHeld", "RemotePathError", "TrainingError", "OutOfDeviceMemory",
                         "TrainingPreempted"}
    assert all(getattr(errors, name).__doc__.strip() for name in in_errors)


@pytest.mark.parametrize("module, name, concern", OLD_NAMES, ids=[f"{m}.{n}" for m, n, _ in OLD_NAMES])
def test_old_names_stay_importable_as_their_concern(module, name, concern):
    if module.startswith("bert_tf.beam."):
        pytest.importorskip("apache_beam")  # the beam extra (absent from the second TensorFlow's venv)
    assert getattr(importlib.import_module(module), name) is concern


def test_how_callers_catch_them():
    # every user-facing problem is a BertError and a ValueError (code that caught ValueError still does)
    for cls in (ConfigError, InputDataError, CheckpointError, ExportError, OutputDirHeld, RemotePathError):
        assert issubclass(cls, BertError) and issubclass(cls, ValueError)
    # the remote path error stays an OSError, with its message as str() (no errno)
    error = RemotePathError("gs://bucket/x: cannot reach it")
    assert isinstance(error, OSError) and str(error) == "gs://bucket/x: cannot reach it"
    # the concerns do not catch each other: a fallback on one never swallows another
    concerns = (ConfigError, InputDataError, CheckpointError, ExportError, OutputDirHeld, RemotePathError)
    for a in concerns:
        for b in concerns:
            assert issubclass(a, b) == (a is b), (a, b)
    # training errors are no ValueError (argument checks that catch one never swallow them)
    assert not issubclass(TrainingError, ValueError) and issubclass(OutOfDeviceMemory, TrainingError)
    assert not issubclass(TrainingPreempted, (ValueError, TrainingError))
    # what the training scripts print as one `error:` line: all but the SIGTERM exit
    for cls in concerns + (BertError, TrainingError, OutOfDeviceMemory):
        assert issubclass(cls, ONE_LINE_ERRORS)
    assert not issubclass(TrainingPreempted, ONE_LINE_ERRORS)
    preempted = TrainingPreempted(40, "out/ckpt-40")
    assert (preempted.step, preempted.checkpoint, str(preempted)) == (40, "out/ckpt-40",
                                                                      "SIGTERM: saved checkpoint out/ckpt-40 at step 40")


@pytest.mark.parametrize("concern", [InputDataError, ConfigError, CheckpointError, ExportError])
def test_a_beam_worker_error_is_found_by_its_new_name(concern):
    pytest.importorskip("apache_beam")  # the beam extra (absent from the second TensorFlow's venv)
    common = importlib.import_module("bert_tf.beam.common")
    # (a worker's error reaches the launcher as its traceback's text)
    text = (f"Traceback (most recent call last):\n  File \"x.py\", line 1\n{concern.__module__}.{concern.__name__}: "
            "a.txt:3: bad line [while running 'Chunks']")
    assert common.job_error(RuntimeError(text)) == "a.txt:3: bad line"
    assert common.job_error(RuntimeError("ValueError: not ours")) is None
