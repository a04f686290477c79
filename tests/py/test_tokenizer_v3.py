"""The deepseek-v3 pre-tokenizer (DeepSeek-V3, R1) against llama.cpp: llama.cpp's models/ has no
vocabulary for it, so scripts/tok-vectors-v3 gives the deepseek-llm vocabulary (read from the
peer tree, `make peer-src`) tokenizer.ggml.pre = "deepseek-v3" and saved llama-tokenize's ids
for 54 texts (tests/data/vectors/tokenizer/deepseek-v3.{inp,out}); `kvant tokenize` must give
every one.  The v3 expressions split digit runs by three, kana and CJK runs apart, and a
punctuation mark before letters into one piece."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from importlib.machinery import SourceFileLoader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VEC = os.path.join(ROOT, "tests", "data", "vectors", "tokenizer")


def test_deepseek_v3_vectors(kvant_bin, tmp_path):
    loader = SourceFileLoader("tok_vectors_v3", os.path.join(ROOT, "scripts", "tok-vectors-v3"))
    gen = importlib.util.module_from_spec(importlib.util.spec_from_loader("tok_vectors_v3", loader))
    loader.exec_module(gen)
    vocab = gen.vocab_v3(str(tmp_path / "v3.gguf"))
    with open(os.path.join(VEC, "deepseek-v3.inp"), encoding="utf-8", newline="") as f:
        texts = f.read().split(gen.SEP)[:-1]
    with open(os.path.join(VEC, "deepseek-v3.out"), encoding="utf-8") as f:
        want = [[int(x) for x in ln.split()] for ln in f.read().split("\n")[:len(texts)]]
    assert len(texts) == len(want) == 54
    bad = []
    for t, w in zip(texts, want):
        fn = tmp_path / "t.txt"
        fn.write_bytes(t.encode("utf-8"))
        r = subprocess.run([kvant_bin, "tokenize", "-m", vocab, "-f", str(fn), "--no-bos", "--json"],
                           capture_output=True, text=True, check=True)
        if json.loads(r.stdout) != w:
            bad.append(t)
    assert not bad, f"{len(bad)} of {len(texts)} differ from llama.cpp: {bad[:3]!r}"
