"""`kvant quantize`: default model -> q8_0 re-read by kvant's reader and by gguf-py, a few
tokens of logits through it (close to the source model), and the error paths: unknown type,
bad output path (nothing left behind), empty calibration file.  Needs `quantize` registered
in build/kvant (src/cli/main.c)."""
from __future__ import annotations

import os

import numpy as np


def test_quantize_q8_0_roundtrip(run_kvant, default_model, kvant_logits, tmp_path):
    out = tmp_path / "m.q8_0.gguf"
    r = run_kvant(["quantize", default_model, out, "--type", "q8_0", "--json"])
    assert r.returncode == 0, r.stderr
    assert '"bits_per_weight"' in r.stdout
    import gguf
    rd = gguf.GGUFReader(str(out))
    types = {t.name: int(t.tensor_type) for t in rd.tensors}
    assert types["blk.0.attn_q.weight"] == 8 and types["token_embd.weight"] == 8
    assert types["blk.0.attn_norm.weight"] == 0
    assert int(rd.fields["general.file_type"].parts[-1][0]) == 7
    info = run_kvant(["info", "-m", out])
    assert info.returncode == 0, info.stderr
    ids = [1, 504, 3458, 282, 260, 1345, 30]
    a = kvant_logits(default_model, ids, 49152)
    b = kvant_logits(str(out), ids, 49152)
    assert np.isfinite(b).all()
    assert (a.argmax(1) == b.argmax(1)).mean() >= 0.8
    rel = np.linalg.norm(a - b) / np.linalg.norm(a)
    assert rel < 0.05, rel


def test_quantize_errors(run_kvant, default_model, tmp_path):
    out = tmp_path / "x.gguf"
    r = run_kvant(["quantize", default_model, out, "--type", "q9_9"])
    assert r.returncode != 0 and "unknown quantization type" in r.stderr
    bad = tmp_path / "no-such-dir" / "x.gguf"
    r = run_kvant(["quantize", default_model, bad, "--type", "q8_0"])
    assert r.returncode != 0 and not bad.exists()
    assert not (tmp_path / "no-such-dir").exists()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = run_kvant(["quantize", default_model, out, "--type", "q4_0", "--calib", empty])
    assert r.returncode != 0 and "calib" in r.stderr and not out.exists()
    assert os.listdir(tmp_path) == ["empty.txt"]
