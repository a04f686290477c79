"""Weights repacked at load for the int8 kernels (backend/cpu/cpu_pack.c, kernels/qpack.h).

Repacking only moves bytes, so the int8 path's logits with packed weights must equal those with
the file's layout (--no-pack) bitwise, for every packed type, through every way a tensor gets
packed:
  - mapped tensors copied into manager memory (a model stored in the type);
  - tensors converted at load and packed in place (--weights-dtype), then unpacked at unload;
  - rows of 256 values (one short group of 8 chunks: a single K-quant super-block) and 512
    (one whole group), as the synthetic models have; the default model's 576 (a short legacy
    group, K-quants not packable).
`kvant bench --json` reports packed_bytes: > 0 where the ISA has packed kernels (avx2,
avx512), 0 on the scalar path, so each run checks that packing really happened (or not).
Run by `make pytest` on the machine's ISA and by `make pytest-isa` under every other one.
"""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

import make_synthetic as ms

N_TOKENS = 24
PACKED_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def _logits(run_kvant, tmp_path, model: str, ids, extra: list[str]) -> np.ndarray:
    tag = zlib.crc32(" ".join([model, *extra]).encode())
    ids_path, out = tmp_path / f"ids{tag}.txt", tmp_path / f"out{tag}.f32"
    ids_path.write_text(" ".join(str(int(i)) for i in ids) + "\n")
    r = run_kvant(["logits", "-m", model, "--tokens-file", ids_path, "--out", out, "-t", "2",
                   "--kv-dtype", "f32", *extra])
    assert r.returncode == 0, f"kvant logits {extra} exited {r.returncode}: {r.stderr[-2000:]}"
    a = np.fromfile(out, dtype="<f4")
    assert a.size > 0 and a.size % len(ids) == 0, f"logits file of {a.size} floats"
    assert np.all(np.isfinite(a)), "logits contain NaN/Inf"
    return a.reshape(len(ids), -1)


def _bench(run_kvant, model: str, extra: list[str]) -> dict:
    r = run_kvant(["bench", "-m", model, "-t", "2", "-p", "4", "-n", "1", "-r", "1", "--json", *extra])
    assert r.returncode == 0, f"kvant bench exited {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(r.stdout)


def _check(run_kvant, tmp_path, model: str, n_vocab: int, extra: list[str]) -> None:
    b = _bench(run_kvant, model, extra)
    if b["isa"] in ("avx2", "avx512"):
        assert b["packed_bytes"] > 0, f"{model} {extra}: no weights repacked on {b['isa']}"
    else:
        assert b["packed_bytes"] == 0, f"{model} {extra}: repacked on {b['isa']} (no packed kernels)"
    assert _bench(run_kvant, model, extra + ["--no-pack"])["packed_bytes"] == 0, "--no-pack ignored"
    ids = np.random.default_rng(tag_seed(model, extra)).integers(0, n_vocab, size=N_TOKENS)
    packed = _logits(run_kvant, tmp_path, model, ids, extra)
    plain = _logits(run_kvant, tmp_path, model, ids, extra + ["--no-pack"])
    diff = np.nonzero(packed.view(np.uint32) != plain.view(np.uint32))
    assert diff[0].size == 0, (f"{model} {extra} on {b['isa']}: packed logits differ from --no-pack at "
                               f"{diff[0].size} places, first (token, id) {diff[0][0]}, {diff[1][0]}: "
                               f"{packed[diff][0]!r} vs {plain[diff][0]!r}")


def tag_seed(model: str, extra: list[str]) -> int:
    return zlib.crc32(" ".join([model.rsplit("/", 1)[-1], *extra]).encode())


@pytest.mark.parametrize("wtype", PACKED_TYPES)
def test_packed_equals_file_layout(wtype, synthetic_dir, run_kvant, tmp_path):
    """A model stored in wtype (mapped tensors, copied and packed)."""
    _check(run_kvant, tmp_path, ms.make_model(synthetic_dir, f"llama-{wtype}"), ms.N_VOCAB, [])


@pytest.mark.parametrize("wdtype", ["q5_0", "q6_K"])
def test_packed_in_place(wdtype, synthetic_dir, run_kvant, tmp_path):
    """Weights converted at load (--weights-dtype) are packed in place and unpacked at unload."""
    _check(run_kvant, tmp_path, ms.make_model(synthetic_dir, "llama-F16"), ms.N_VOCAB,
           ["--weights-dtype", wdtype])


def test_packed_default_model(default_model, run_kvant, tmp_path):
    """The default model (Q4_1, rows of 576 values: a short last group)."""
    _check(run_kvant, tmp_path, default_model, 49152, [])
