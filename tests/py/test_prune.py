"""`kvant prune`: structured pruning on tiny synthetic models and on the default model.

What is checked:
  * depth: the layer removed is the one of lowest Block Influence (from the JSON), the kept
    layer's tensors are copied byte for byte under the new number, block_count is updated,
    and kvant's logits on the pruned file match the float64 numpy reference (ref_model.py)
    on that file;
  * FFN width (F32, so copies are exact): per-layer widths are written as an int32 array,
    the kept gate/up rows and down columns are the same ascending channel subset of the
    input, a compensation ffn_down.bias is written (none with --no-bias), and logits match
    the reference (ref_model reads per-layer widths and applies the biases);
  * KV-head groups (qwen2 F32 with biases): head counts and key_length are written, the
    kept Q heads belong to the kept KV group, the KV cache per token halves, and logits
    match the reference;
  * per-layer KV heads (--heads-keep 0.75 of 2 layers x 2 groups): one layer keeps 2 groups
    and the other 1, written as head-count arrays; KV bytes per token 3/4; logits match the
    reference with f32, f16 and q8_0 KV caches; `kvant plan` counts the per-layer heads; the
    pruned file prunes again; --heads-uniform refuses a fraction it cannot remove equally;
  * quantized input (Q4_1): the down projection is requantized to Q4_1, the file loads and
    matches the reference on itself;
  * refused requests (fraction >= 1, every layer, calibration text too short, nothing to
    prune, an unreachable target) exit non-zero with a message and leave nothing behind;
  * the default model at --drop-layers 3: loads, KV bytes per token fall by 3/30.
"""
from __future__ import annotations

import json
import os

import numpy as np
from gguf import GGUFReader

import make_synthetic as ms
from ref_model import ref_logits

CALIB = "tests/data/english.txt"
BOUND = 5e-6  # as test_logits.py: f32 rounding only


def _fields(path):
    r = GGUFReader(str(path))
    return r, {t.name: t for t in r.tensors}


def _field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def _prune(run_kvant, src, out, *args):
    r = run_kvant(["prune", src, out, "--calib", CALIB, "-t", "2", "--json", *args])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _check_logits(kvant_logits, path, seed):
    ids = np.random.default_rng(seed).integers(0, ms.N_VOCAB, size=16)
    ref = ref_logits(str(path), ids)
    kv = kvant_logits(str(path), ids, ms.N_VOCAB)
    err = float(np.linalg.norm(kv - ref) / np.linalg.norm(ref))
    assert err < BOUND, f"{path}: rel err {err:.3g} vs the numpy reference"


def test_prune_depth_synthetic(run_kvant, synthetic_dir, kvant_logits, tmp_path):
    src = ms.make_model(synthetic_dir, "llama-F32")
    out = tmp_path / "d.gguf"
    j = _prune(run_kvant, src, out, "--drop-layers", "1")
    bi = j["block_influence"]
    assert len(bi) == 2 and all(0 <= b <= 2 for b in bi) and bi[0] != bi[1]
    gone = int(np.argmin(bi))
    assert j["removed_layers"] == [gone] and j["layers_out"] == 1
    kept = 1 - gone
    r, t = _fields(out)
    _, t0 = _fields(src)
    assert int(_field(r, "llama.block_count")) == 1
    assert _field(r, "kvant.prune.removed_layers") == [gone]
    assert not any(n.startswith("blk.1.") for n in t)
    for n, ti in t.items():
        if n.startswith("blk.0."):
            a = np.asarray(ti.data).tobytes()
            b = np.asarray(t0[n.replace("blk.0.", f"blk.{kept}.")].data).tobytes()
            assert a == b, n
    assert j["kv_bytes_per_token_out"] * 2 == j["kv_bytes_per_token_in"]
    _check_logits(kvant_logits, out, 11)
    # --depth-bias: the removed layer's mean residual change becomes a bias of the kept layer
    # before it (none when the first layer goes); the reference applies it
    out2 = tmp_path / "db.gguf"
    j2 = _prune(run_kvant, src, out2, "--drop-layers", "1", "--depth-bias")
    assert j2["removed_layers"] == [gone] and j2["depth_bias"] is True
    _, t2 = _fields(out2)
    assert ("blk.0.ffn_down.bias" in t2) == (gone == 1)
    if gone == 1:
        b = np.asarray(t2["blk.0.ffn_down.bias"].data)
        assert np.isfinite(b).all() and np.abs(b).max() > 0
    _check_logits(kvant_logits, out2, 17)


def test_prune_ffn_width_synthetic(run_kvant, synthetic_dir, kvant_logits, tmp_path):
    src = ms.make_model(synthetic_dir, "llama-F32")
    out = tmp_path / "w.gguf"
    j = _prune(run_kvant, src, out, "--ffn-keep", "0.5")
    widths = j["ffn_widths"]
    assert abs(sum(widths) - 512) <= 2 * 16 and all(w % 32 == 0 for w in widths)
    assert j["requantized_tensors"] == 0 and j["layers_out"] == 2
    r, t = _fields(out)
    _, t0 = _fields(src)
    ff = _field(r, "llama.feed_forward_length")
    assert list(ff) == widths if widths[0] != widths[1] else int(ff) == widths[0]
    for L in range(2):
        g0 = np.asarray(t0[f"blk.{L}.ffn_gate.weight"].data).reshape(512, ms.N_EMBD)
        g1 = np.asarray(t[f"blk.{L}.ffn_gate.weight"].data).reshape(widths[L], ms.N_EMBD)
        idx = [int(np.nonzero((g0 == row).all(axis=1))[0][0]) for row in g1]
        assert idx == sorted(set(idx)), "kept channels not an ascending subset"
        u0 = np.asarray(t0[f"blk.{L}.ffn_up.weight"].data).reshape(512, ms.N_EMBD)
        u1 = np.asarray(t[f"blk.{L}.ffn_up.weight"].data).reshape(widths[L], ms.N_EMBD)
        d0 = np.asarray(t0[f"blk.{L}.ffn_down.weight"].data).reshape(ms.N_EMBD, 512)
        d1 = np.asarray(t[f"blk.{L}.ffn_down.weight"].data).reshape(ms.N_EMBD, widths[L])
        assert np.array_equal(u1, u0[idx]) and np.array_equal(d1, d0[:, idx])
        b = np.asarray(t[f"blk.{L}.ffn_down.bias"].data)  # compensation: removed channels' mean
        assert b.shape == (ms.N_EMBD,) and np.isfinite(b).all() and np.abs(b).max() > 0
    assert j["bias_compensation"] is True
    _check_logits(kvant_logits, out, 12)


def test_prune_refit_synthetic(run_kvant, synthetic_dir, kvant_logits, tmp_path):
    """--refit: same channels as without it, the kept ffn_down columns and the bias refit by
    least squares (they differ from a copy), shrink 1 gives back the mean-bias compensation,
    and the file matches the numpy reference."""
    src = ms.make_model(synthetic_dir, "llama-F32")
    base = _prune(run_kvant, src, tmp_path / "b.gguf", "--ffn-keep", "0.5")
    fit = _prune(run_kvant, src, tmp_path / "r.gguf", "--ffn-keep", "0.5", "--refit")
    flap = _prune(run_kvant, src, tmp_path / "s.gguf", "--ffn-keep", "0.5", "--refit",
                  "--refit-shrink", "1")
    assert base["ffn_widths"] == fit["ffn_widths"] == flap["ffn_widths"]
    assert fit["refit"] is True and base["refit"] is False and fit["requantized_tensors"] == 2
    _, tb = _fields(tmp_path / "b.gguf")
    _, tr = _fields(tmp_path / "r.gguf")
    _, ts = _fields(tmp_path / "s.gguf")
    for L in range(2):
        w = base["ffn_widths"][L]
        g = [np.asarray(t[f"blk.{L}.ffn_gate.weight"].data) for t in (tb, tr)]
        assert np.array_equal(g[0], g[1]), "refit changed the kept gate rows"
        db, dr, ds = (np.asarray(t[f"blk.{L}.ffn_down.weight"].data).reshape(ms.N_EMBD, w)
                      for t in (tb, tr, ts))
        bb, br, bs = (np.asarray(t[f"blk.{L}.ffn_down.bias"].data) for t in (tb, tr, ts))
        scale = np.abs(db).max()
        assert np.abs(dr - db).max() > 1e-3 * scale, "refit left ffn_down unchanged"
        assert np.abs(ds - db).max() < 1e-4 * scale, "shrink 1 is not the mean compensation"
        assert np.abs(bs - bb).max() < 1e-4 * np.abs(bb).max()
        assert np.isfinite(br).all() and not np.allclose(br, bb)
    _check_logits(kvant_logits, tmp_path / "r.gguf", 15)
    h = tmp_path / "h.gguf"
    j = _prune(run_kvant, ms.make_model(synthetic_dir, "qwen2-F32"), h, "--heads-keep", "0.5",
               "--refit")
    assert j["n_head_kv_out"] == 1 and j["requantized_tensors"] == 2
    _check_logits(kvant_logits, h, 16)


def test_prune_ffn_uniform_and_target(run_kvant, synthetic_dir, tmp_path):
    src = ms.make_model(synthetic_dir, "llama-F32")
    j = _prune(run_kvant, src, tmp_path / "u.gguf", "--ffn-keep", "0.25", "--ffn-uniform",
               "--no-bias")
    assert j["ffn_widths"] == [128, 128] and j["bias_compensation"] is False
    _, t = _fields(tmp_path / "u.gguf")
    assert not any(n.endswith(".bias") for n in t)
    j = _prune(run_kvant, src, tmp_path / "t.gguf", "--target-params", "0.8", "--method", "width")
    assert 0.76 < j["params_kept"] < 0.84, j["params_kept"]
    assert j["layers_out"] == 2


def test_prune_heads_synthetic(run_kvant, synthetic_dir, kvant_logits, tmp_path):
    src = ms.make_model(synthetic_dir, "qwen2-F32")
    out = tmp_path / "h.gguf"
    j = _prune(run_kvant, src, out, "--heads-keep", "0.5")
    assert j["n_head_kv_in"] == 2 and j["n_head_kv_out"] == 1
    assert j["kv_bytes_per_token_out"] * 2 == j["kv_bytes_per_token_in"]
    r, t = _fields(out)
    _, t0 = _fields(src)
    assert int(_field(r, "qwen2.attention.head_count")) == 2
    assert int(_field(r, "qwen2.attention.head_count_kv")) == 1
    assert int(_field(r, "qwen2.attention.key_length")) == ms.HEAD_DIM
    hd = ms.HEAD_DIM
    for L in range(2):
        k0 = np.asarray(t0[f"blk.{L}.attn_k.weight"].data).reshape(2 * hd, ms.N_EMBD)
        k1 = np.asarray(t[f"blk.{L}.attn_k.weight"].data).reshape(hd, ms.N_EMBD)
        g = 0 if np.array_equal(k1, k0[:hd]) else 1
        assert np.array_equal(k1, k0[g * hd:(g + 1) * hd])
        q0 = np.asarray(t0[f"blk.{L}.attn_q.weight"].data).reshape(4 * hd, ms.N_EMBD)
        q1 = np.asarray(t[f"blk.{L}.attn_q.weight"].data).reshape(2 * hd, ms.N_EMBD)
        assert np.array_equal(q1, q0[2 * g * hd:2 * (g + 1) * hd]), "Q heads not those of the kept group"
        o0 = np.asarray(t0[f"blk.{L}.attn_output.weight"].data).reshape(ms.N_EMBD, 4 * hd)
        o1 = np.asarray(t[f"blk.{L}.attn_output.weight"].data).reshape(ms.N_EMBD, 2 * hd)
        assert np.array_equal(o1, o0[:, 2 * g * hd:2 * (g + 1) * hd])
        b0 = np.asarray(t0[f"blk.{L}.attn_v.bias"].data)
        assert np.array_equal(np.asarray(t[f"blk.{L}.attn_v.bias"].data), b0[g * hd:(g + 1) * hd])
    _check_logits(kvant_logits, out, 13)


def _logits_kv(run_kvant, path, ids, kv_dtype, tmp_path):
    """kvant logits with a quantized KV cache (the default activations)."""
    ids_path, out = tmp_path / "ids.txt", tmp_path / f"l-{kv_dtype}.f32"
    ids_path.write_text(" ".join(str(int(i)) for i in ids) + "\n")
    r = run_kvant(["logits", "-m", str(path), "--tokens-file", str(ids_path), "--out", str(out),
                   "-t", "2", "--kv-dtype", kv_dtype])
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(ids), ms.N_VOCAB)


def test_prune_heads_per_layer(run_kvant, synthetic_dir, kvant_logits, tmp_path):
    """--heads-keep 0.75 of 2 layers x 2 KV groups: one layer keeps 2, the other 1 (the
    global ranking), written as per-layer head-count arrays; the KV cache per token is
    3/4; logits match the reference; the pruned file prunes again."""
    src = ms.make_model(synthetic_dir, "qwen2-F32")
    out = tmp_path / "lh.gguf"
    j = _prune(run_kvant, src, out, "--heads-keep", "0.75")
    assert sorted(j["kv_heads"]) == [1, 2], j["kv_heads"]
    assert j["kv_bytes_per_token_out"] * 4 == j["kv_bytes_per_token_in"] * 3
    r, t = _fields(out)
    _, t0 = _fields(src)
    hkv = [int(v) for v in _field(r, "qwen2.attention.head_count_kv")]
    hq = [int(v) for v in _field(r, "qwen2.attention.head_count")]
    assert hkv == j["kv_heads"] and hq == [2 * v for v in hkv]
    hd = ms.HEAD_DIM
    for L in range(2):
        k0 = np.asarray(t0[f"blk.{L}.attn_k.weight"].data).reshape(2 * hd, ms.N_EMBD)
        k1 = np.asarray(t[f"blk.{L}.attn_k.weight"].data).reshape(hkv[L] * hd, ms.N_EMBD)
        if hkv[L] == 2:
            assert np.array_equal(k1, k0)
        else:
            assert any(np.array_equal(k1, k0[g * hd:(g + 1) * hd]) for g in range(2))
    _check_logits(kvant_logits, out, 17)
    # the quantized KV caches walk the per-layer rows too (a wrong stride reads garbage)
    ids = np.random.default_rng(18).integers(0, ms.N_VOCAB, size=16)
    ref = ref_logits(str(out), ids)
    for kvd in ("f16", "q8_0"):
        kv = _logits_kv(run_kvant, out, ids, kvd, tmp_path)
        err = float(np.linalg.norm(kv - ref) / np.linalg.norm(ref))
        assert err < 2e-2, f"--kv-dtype {kvd}: rel err {err:.3g}"
    # the planner sizes KV per token from the per-layer heads
    p = run_kvant(["plan", "-m", str(out), "--json", "--kv-dtype", "f32"])
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)["plans"][0]["plan"]
    assert plan["kv_bytes_per_token"] == 2 * 3 * hd * 4 and plan["model"]["kv_heads_total"] == 3
    # a pruned input: removing a layer rewrites the head counts of the kept one
    again = tmp_path / "lh1.gguf"
    j2 = _prune(run_kvant, out, again, "--drop-layers", "1")
    kept = [L for L in range(2) if L not in j2["removed_layers"]][0]
    r2, _ = _fields(again)
    assert int(_field(r2, "qwen2.attention.head_count_kv")) == hkv[kept]
    assert j2["kv_bytes_per_token_out"] == 2 * hkv[kept] * hd * 2  # f16 default
    _check_logits(kvant_logits, again, 19)
    # the same fraction removed from every layer cannot be 3 of 4
    bad = run_kvant(["prune", src, str(tmp_path / "u.gguf"), "--calib", CALIB, "--heads-keep",
                     "0.75", "--heads-uniform"])
    assert bad.returncode != 0 and "keeps every KV-head group" in bad.stderr
    assert not (tmp_path / "u.gguf").exists()


def test_prune_quantized_synthetic(run_kvant, synthetic_dir, kvant_logits, tmp_path):
    src = ms.make_model(synthetic_dir, "llama-tied-Q8_0")  # Q4_1 matrices, Q8_0 embeddings
    out = tmp_path / "q.gguf"
    j = _prune(run_kvant, src, out, "--ffn-keep", "0.6", "--drop-layers", "1")
    assert j["requantized_tensors"] == 1 and j["layers_out"] == 1
    assert j["weight_bytes_out"] < j["weight_bytes_in"]
    _, t = _fields(out)
    assert int(t["blk.0.ffn_down.weight"].tensor_type) == 3  # still Q4_1
    _check_logits(kvant_logits, out, 14)


def test_prune_refused(run_kvant, synthetic_dir, tmp_path):
    src = ms.make_model(synthetic_dir, "llama-F32")
    out = tmp_path / "x.gguf"
    short = tmp_path / "short.txt"
    short.write_text("A few words only.\n")
    cases = [
        (["--calib", CALIB, "--target-params", "1.0"], "(0, 1)"),
        (["--calib", CALIB, "--ffn-keep", "1.5"], "(0, 1)"),
        (["--calib", CALIB, "--drop-layers", "2"], "every layer"),
        (["--calib", str(short), "--drop-layers", "1"], "too short"),
        (["--calib", CALIB], "nothing to prune"),
        (["--calib", CALIB, "--target-params", "0.01", "--method", "width"], "cannot be reached"),
        (["--calib", CALIB, "--heads-keep", "0.1"], "fewer than one per layer"),
        (["--drop-layers", "1"], "--calib FILE is required"),
        (["--calib", CALIB, "--ffn-keep", "0.5", "--refit", "--no-bias"], "--no-bias"),
        (["--calib", CALIB, "--ffn-keep", "0.5", "--refit-shrink", "2"], "--refit-shrink"),
        (["--calib", CALIB, "--drop-layers", "1", "--depth-bias", "--no-bias"], "--no-bias"),
    ]
    for args, msg in cases:
        r = run_kvant(["prune", src, out, *args])
        assert r.returncode != 0, args
        assert msg in r.stderr, (args, r.stderr)
        assert not out.exists(), args
    assert sorted(os.listdir(tmp_path)) == ["short.txt"]


def test_prune_default_model_depth(run_kvant, default_model, kvant_logits, tmp_path):
    out = tmp_path / "d3.gguf"
    r = run_kvant(["prune", default_model, out, "--calib", CALIB, "--drop-layers", "3", "-t", "2",
                   "--json"])
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["layers_out"] == 27 and len(j["removed_layers"]) == 3
    bi = j["block_influence"]
    assert sorted(bi)[:3] == sorted(bi[i] for i in j["removed_layers"])
    assert j["kv_bytes_per_token_out"] * 30 == j["kv_bytes_per_token_in"] * 27
    assert 0.85 < j["weight_bytes_kept"] < 0.95
    info = run_kvant(["info", "-m", out, "--json"])
    assert info.returncode == 0, info.stderr
    ids = [1, 504, 3458, 282, 260, 1345, 30]
    a = kvant_logits(default_model, ids, 49152)
    b = kvant_logits(str(out), ids, 49152)
    assert np.isfinite(b).all()
    assert (a.argmax(1) == b.argmax(1)).mean() >= 0.5


def test_ffn_length_array_checked(run_kvant, tmp_path):
    """A per-layer feed_forward_length whose length is not block_count is refused by name."""
    bad = ms.Spec("llama", "F32", "F32", tied=True, ff=(512, 512, 512))
    path = ms.write_model(str(tmp_path / "bad-ff.gguf"), bad, seed=3)
    r = run_kvant(["run", "-m", path, "-p", "hi", "-n", "1"])
    assert r.returncode != 0
    assert "feed_forward_length" in r.stderr and "one per layer" in r.stderr, r.stderr
