#!/usr/bin/env bash
# Fetches the peer's source and test data: the PyPI sdist of
# llama-cpp-python==0.3.36 (llama.cpp 0c1e570 under vendor/llama.cpp),
# checked by sha256 and unpacked to build/peer/llama.cpp.  The tests read
# its tokenizer vocabularies (models/ggml-vocab-*.gguf with .inp/.out) and
# chat templates (models/templates/); scripts/peer-logits builds its tools.
# Nothing of it is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
ver=0.3.36
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
dst=build/peer/llama.cpp
stamp=build/peer/.src-$sha
# what the tests read; a copy missing any of it is unpacked again
need="models/templates models/ggml-vocab-llama-bpe.gguf models/ggml-vocab-qwen2.gguf
      models/ggml-vocab-qwen35.gguf models/ggml-vocab-gemma-4.gguf"
complete=1
for f in $need; do [ -e "$dst/$f" ] || complete=0; done
if [ -f "$stamp" ] && [ "$complete" = 1 ]; then
  exit 0
fi
mkdir -p build/peer
tar=build/peer/llama_cpp_python-$ver.tar.gz
if ! { [ -f "$tar" ] && echo "$sha  $tar" | sha256sum -c --quiet - 2>/dev/null; }; then
  echo "peer-src: downloading llama-cpp-python==$ver (sdist) from PyPI"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$ver" -d "$tmp"
  echo "$sha  $tmp/llama_cpp_python-$ver.tar.gz" | sha256sum -c --quiet -
  mv "$tmp/llama_cpp_python-$ver.tar.gz" "$tar"
fi
rm -rf build/peer/unpack "$dst"
mkdir -p build/peer/unpack
tar -xzf "$tar" -C build/peer/unpack
mv "build/peer/unpack/llama_cpp_python-$ver/vendor/llama.cpp" "$dst"
rm -rf build/peer/unpack
touch "$stamp"
echo "peer-src: $dst ok (llama.cpp 0c1e570)"
