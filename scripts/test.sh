#!/usr/bin/env bash
# Installs bert_tf with its test extra into .venv, then runs the linter and the whole test suite.
source "$(dirname "$0")/venv.sh" "[test]"
ruff check .
pytest -n 2 -q "$@"
