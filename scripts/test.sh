#!/usr/bin/env bash
# Installs bert_tf with its test extra into .venv, then runs the linter and the whole test suite
# (TensorFlow 2.20). Without arguments it then also runs the fast subset on the other supported
# TensorFlow, SECOND_TF (2.21; empty skips it), in a venv of its own (.venv-tf221): the in-process tests
# (-m "not slow"), where a TensorFlow release changes results; the script runs on top of them stay on 2.20.
SCRIPTS="$(cd "$(dirname "$0")" && pwd)"
source "$SCRIPTS/venv.sh" "[test]"
ruff check .
pytest -n 2 -q "$@"
SECOND_TF=${SECOND_TF-2.21}
if [ $# -eq 0 ] && [ -n "$SECOND_TF" ]; then
  echo "== the fast subset on TensorFlow $SECOND_TF"
  source "$SCRIPTS/venv.sh" "[test-fast]" "$SECOND_TF"
  pytest -n 2 -q -m "not slow"
fi
