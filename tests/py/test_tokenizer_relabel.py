"""Pre-tokenizers that llama.cpp's models/ has no vocabulary for, against llama.cpp:
scripts/tok-vectors-relabel gives a vocabulary it has another tokenizer.ggml.pre (deepseek-v3
on the deepseek-llm vocabulary, read from the peer tree of `make peer-src`; gpt-4o, o200k's
expression, on the vendored gpt-2 one) and saved llama-tokenize's ids for 56 texts each
(tests/data/vectors/tokenizer/PRE.{inp,out}); `kvant tokenize` must give every one.  deepseek-v3
splits digit runs by three, kana and CJK runs apart and a punctuation mark before letters into
one piece; gpt-4o splits case changes inside words (camelCase, HTTPServer) and keeps '/' runs
after punctuation."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from importlib.machinery import SourceFileLoader

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VEC = os.path.join(ROOT, "tests", "data", "vectors", "tokenizer")


def _generator():
    loader = SourceFileLoader("tok_vectors_relabel", os.path.join(ROOT, "scripts", "tok-vectors-relabel"))
    gen = importlib.util.module_from_spec(importlib.util.spec_from_loader("tok_vectors_relabel", loader))
    loader.exec_module(gen)
    return gen


@pytest.mark.parametrize("pre", ["deepseek-v3", "gpt-4o"])
def test_relabelled_vectors(kvant_bin, tmp_path, pre):
    gen = _generator()
    vocab = gen.relabel(str(tmp_path / "v.gguf"), pre)
    with open(os.path.join(VEC, pre + ".inp"), encoding="utf-8", newline="") as f:
        texts = f.read().split(gen.SEP)[:-1]
    with open(os.path.join(VEC, pre + ".out"), encoding="utf-8") as f:
        want = [[int(x) for x in ln.split()] for ln in f.read().split("\n")[:len(texts)]]
    assert len(texts) == len(want) == 56
    bad = []
    for t, w in zip(texts, want):
        fn = tmp_path / "t.txt"
        fn.write_bytes(t.encode("utf-8"))
        r = subprocess.run([kvant_bin, "tokenize", "-m", vocab, "-f", str(fn), "--no-bos", "--json"],
                           capture_output=True, text=True, check=True)
        if json.loads(r.stdout) != w:
            bad.append(t)
    assert not bad, f"{pre}: {len(bad)} of {len(texts)} differ from llama.cpp: {bad[:3]!r}"
