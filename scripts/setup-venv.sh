#!/usr/bin/env bash
# Creates .venv with the pinned Python test tools (tests/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r tests/requirements.txt
