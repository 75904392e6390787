"""Shared test fixtures: where the optional real-format files live, and tiny vocabularies."""

import os
import pathlib

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = pathlib.Path(__file__).resolve().parent.parent
TESTDATA = REPO / "tests" / "testdata"
# ../shared sits beside the checkout in CI and in the sessions; tests that need it skip without it.
SHARED = pathlib.Path(os.environ.get("BERT_TF_SHARED", REPO.parent / "shared"))


def shared_path(*parts) -> pathlib.Path:
    """A path under ../shared, or a clean skip when that file is not there."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not available")
    return path


@pytest.fixture
def shared():
    return shared_path


TINY_VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",",
    "low", "lowest", "hello", "how", "are", "you", "!", "?",
    "the", "a", "cat", "dog", "sat", "on", "mat", ".", "##s",
]


@pytest.fixture
def tiny_vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    return str(path)
