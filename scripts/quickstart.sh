#!/usr/bin/env bash
# Installs bert_tf into .venv and runs the whole workflow on the built-in sample (see README).
source "$(dirname "$0")/venv.sh" ""  # (an explicit "": a sourced script would take our arguments)
python quickstart.py "$@"
