#!/usr/bin/env bash
# Creates build/guidellm-venv with guidellm and its pinned dependencies
# (tests/requirements-guidellm.txt), then builds guidellm's tokenizer for
# the default model offline from the GGUF itself (transformers'
# AutoTokenizer, gguf_file=) into build/guidellm-tok, so no benchmark run
# downloads anything.  Idempotent: each step is skipped when its stamp is
# newer than its inputs.  One run at a time (a lock): `make test` starts it
# in the background at the beginning, and `make pytest` waits for it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
exec 9>build/.guidellm-setup.lock
flock 9
venv=build/guidellm-venv
req=tests/requirements-guidellm.txt
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
tok=build/guidellm-tok
mkdir -p build
if [ ! -f "$venv/.stamp" ] || [ "$req" -nt "$venv/.stamp" ]; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  t0=$(date +%s)
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
  echo "guidellm-venv: installed in $(( $(date +%s) - t0 )) s"
  touch "$venv/.stamp"
fi
if [ ! -f "$tok/.stamp" ] || [ "$model" -nt "$tok/.stamp" ]; then
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" - "$model" "$tok" <<'PY'
import os, sys
from transformers import AutoTokenizer
model, out = sys.argv[1], sys.argv[2]
t = AutoTokenizer.from_pretrained(os.path.dirname(model), gguf_file=os.path.basename(model))
t.save_pretrained(out)
print(f"guidellm-tok: {type(t).__name__} with {len(t)} tokens from {model} -> {out}")
PY
  touch "$tok/.stamp"
fi
