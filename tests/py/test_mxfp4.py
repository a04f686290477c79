"""MXFP4 weights (GGUF type 39) end to end, against mxfp4_ref.py (an independent numpy decoder
and encoder; gguf 0.17 has no MXFP4).

* test_mxfp4_logits: a tiny llama (untied head) / qwen2 (tied) whose every matrix, the embedding
  table included, is MXFP4 with random codes and scales (make_synthetic "MXFP4"), against the
  float64 reference (ref_model.py) of its twin holding the numpy decode of the same blocks as
  F32.  --exact (f32 activations): the bound of test_logits.py, 5e-6, since both sides use the
  stored values exactly; a decoding slip (nibble order, a scale off by 2) gives O(1).  The
  default path (int8 activations, packed weights, split head) within INT8_BOUND of the same
  reference.  `kvant info` reports the type and the 17-bytes-per-32 sizes.
  Measured (AVX-512 host, 2 threads, every ISA): --exact 2.8e-7..7.3e-7; int8 path llama 2.4e-2, qwen2
  2.6e-2, where the same path gives Q4_0 2.2e-2 / 2.0e-2, Q8_0 1.9e-2, Q6_K 1.8e-2 on these
  random models (the activation rounding, not the weight type): INT8_BOUND 5e-2.
* test_mxfp4_moe: qwen3moe and mixtral (make_family) with MXFP4 stacked experts ([experts][rows]
  [cols] tensors) and every other matrix MXFP4, against the reference of the F32 twin: --exact
  within EXACT_BOUND.
* test_mxfp4_quantize: `kvant quantize --type mxfp4` of the F16 synthetic llama: file_type 38
  (llama.cpp's MOSTLY_MXFP4_MOE), every matrix type 39 and bitwise the numpy encoder's blocks of
  the F16 values, norms left F32, and logits within QUANT_BOUND of the F16 model's.
  Measured rel L2 vs F16 (--exact, 20 tokens): mxfp4 0.49 (argmax 10/20); for scale, kvant's
  own q4_0 0.37, q4_K 0.35, q5_0 0.20, q8_0 0.024 on the same random model; mxfp4's weight
  round-trip error is 1.34x q4_0's (test_dtype: 0.115 vs 0.086), its logit error 1.34x too.
  QUANT_BOUND 0.75 = 1.5x; the bitwise check against the numpy encoder is the sharp one.

Every ISA: run with KVANT_ISA=scalar|avx2|avx512 (make pytest-isa lists the reference tests).
"""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from gguf import GGUFReader

import make_family as mf
import make_synthetic as ms
import mxfp4_ref
from ref_model import check_argmax, ref_logits, rel_err

N_TOKENS = 20
EXACT_BOUND = 5e-6     # as test_logits.py: kvant f32 vs float64 on the same stored values
INT8_BOUND = 5e-2      # int8 activations (measured 2.4e-2 / 2.6e-2; see the docstring)
QUANT_BOUND = 0.75     # mxfp4 RTN vs the F16 source (measured 0.49; see the docstring)


def _ids(name: str) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(name.encode())).integers(0, ms.N_VOCAB, size=N_TOKENS)


def _int8_logits(run_kvant, model: str, ids, tmp_path) -> np.ndarray:
    """`kvant logits` on its default path (int8 activations; no --exact)."""
    f, out = tmp_path / "ids8.txt", tmp_path / "l8.f32"
    f.write_text(" ".join(str(int(i)) for i in ids) + "\n")
    r = run_kvant(["logits", "-m", model, "--tokens-file", f, "--out", out, "-t", "2",
                   "--kv-dtype", "f32"])
    assert r.returncode == 0, r.stderr[-4000:]
    return np.fromfile(out, dtype="<f4").reshape(len(ids), ms.N_VOCAB)


@pytest.mark.parametrize("arch,tied", [("llama", False), ("qwen2", True)])
def test_mxfp4_logits(arch, tied, tmp_path, kvant_logits, run_kvant, record_result):
    seed = zlib.crc32(f"{arch}-mxfp4".encode())
    q = ms.write_model(str(tmp_path / "q.gguf"), ms.Spec(arch, "MXFP4", "MXFP4", tied), seed)
    f = ms.write_model(str(tmp_path / "f.gguf"), ms.Spec(arch, "MXFP4-F32", "MXFP4-F32", tied), seed)
    kv, tab = mxfp4_ref.read_table(q)
    assert tab["blk.0.attn_q.weight"][0] == mxfp4_ref.MXFP4
    assert tab["token_embd.weight"][0] == mxfp4_ref.MXFP4 and tab["blk.1.ffn_norm.weight"][0] == 0
    # the twin holds the numpy decode of the file's bytes (every code of both nibbles occurs)
    twin = {t.name: t for t in GGUFReader(f).tensors}
    raw = mxfp4_ref.tensor_bytes(q, tab["blk.1.ffn_down.weight"])
    assert np.array_equal(mxfp4_ref.dequantize(raw, raw.size // 17 * 32),
                          np.asarray(twin["blk.1.ffn_down.weight"].data).reshape(-1))
    codes = np.concatenate([raw.reshape(-1, 17)[:, 1:] & 15, raw.reshape(-1, 17)[:, 1:] >> 4])
    assert len(np.unique(codes)) == 16

    info = run_kvant(["info", "-m", q, "--json"])
    assert info.returncode == 0, info.stderr
    ti = {t["name"]: t for t in json.loads(info.stdout)["tensors"]}
    assert ti["blk.0.ffn_up.weight"]["type"] == "mxfp4"
    assert ti["blk.0.ffn_up.weight"]["bytes"] == ms.N_FF * ms.N_EMBD // 32 * 17

    ids = _ids(f"{arch}-mxfp4")
    ref = ref_logits(f, ids)
    ex = kvant_logits(q, ids, ms.N_VOCAB)
    assert np.all(np.isfinite(ex))
    err = rel_err(ex, ref)
    agree, bad = check_argmax(ex, ref)
    i8 = _int8_logits(run_kvant, q, ids, tmp_path)
    err8 = rel_err(i8, ref)
    record_result(f"mxfp4_logits_{arch}", {"rel_l2_exact": err, "rel_l2_int8": err8,
                                           "argmax_agree": agree, "n": N_TOKENS})
    print(f"{arch} mxfp4: exact rel L2 {err:.3e}, int8 path {err8:.3e}, argmax {agree}/{N_TOKENS}")
    assert err < EXACT_BOUND, f"{arch} mxfp4 --exact: rel L2 {err:.3e} >= {EXACT_BOUND:.0e}"
    assert not bad, bad
    assert err8 < INT8_BOUND, f"{arch} mxfp4 int8 path: rel L2 {err8:.3e} >= {INT8_BOUND:.0e}"


def test_mxfp4_quantize(synthetic_dir, tmp_path, run_kvant, kvant_logits, record_result):
    src = ms.make_model(synthetic_dir, "llama-F16")
    out = tmp_path / "m.mxfp4.gguf"
    r = run_kvant(["quantize", src, out, "--type", "mxfp4", "--json"])
    assert r.returncode == 0, r.stderr
    kv, tab = mxfp4_ref.read_table(str(out))
    assert kv["general.file_type"] == 38
    n_mx = 0
    for t in GGUFReader(src).tensors:
        typ = tab[t.name][0]
        if len(t.shape) == 1:
            assert typ == 0, t.name          # norms stay F32
            continue
        assert typ == mxfp4_ref.MXFP4, (t.name, typ)
        x = np.asarray(t.data).astype(np.float32).reshape(-1)
        want = mxfp4_ref.quantize(x).reshape(-1)
        got = mxfp4_ref.tensor_bytes(str(out), tab[t.name])
        bad = int((want.reshape(-1, 17) != got.reshape(-1, 17)).any(axis=1).sum())
        assert bad == 0, f"{t.name}: {bad} of {want.size // 17} blocks differ from the numpy encoder"
        n_mx += 1
    assert n_mx == 2 + 7 * ms.N_LAYER
    ids = _ids("mxfp4-quantize")
    a = kvant_logits(src, ids, ms.N_VOCAB)
    b = kvant_logits(str(out), ids, ms.N_VOCAB)
    err = rel_err(b, a.astype(np.float64))
    record_result("mxfp4_quantize", {"rel_l2_vs_f16": err, "n": N_TOKENS})
    print(f"mxfp4 quantize: logits rel L2 vs F16 {err:.3e}")
    assert np.all(np.isfinite(b)) and err < QUANT_BOUND, err


@pytest.mark.parametrize("family", ["qwen3moe", "mixtral"])
def test_mxfp4_moe(family, tmp_path, kvant_logits, record_result):
    seed = zlib.crc32(f"{family}-mxfp4".encode())
    q = mf.write_family(str(tmp_path / "q.gguf"), family, "MXFP4", seed=seed)
    f = mf.write_family(str(tmp_path / "f.gguf"), family, "MXFP4-F32", seed=seed)
    _, tab = mxfp4_ref.read_table(q)
    t, ne, _ = tab["blk.0.ffn_up_exps.weight"]
    assert t == mxfp4_ref.MXFP4 and len(ne) == 3 and ne[2] == mf.MOE[family].n_expert
    n_vocab = mf.SHAPES["tiny"][family].n_vocab
    ids = _ids(f"{family}-mxfp4")
    ref = ref_logits(f, ids)
    ex = kvant_logits(q, ids, n_vocab)
    err = rel_err(ex, ref)
    agree, bad = check_argmax(ex, ref)
    record_result(f"mxfp4_moe_{family}", {"rel_l2_exact": err, "argmax_agree": agree})
    print(f"{family} mxfp4 experts: exact rel L2 {err:.3e}, argmax {agree}/{N_TOKENS}")
    assert err < EXACT_BOUND and not bad, (err, bad)
