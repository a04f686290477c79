"""Hybrid models (recurrent + attention layers) through kvant: lfm2 (short convolutions) and
granite-h (Mamba-2, Granite 4.0-H's layout), random-weight files written by make_family.py.

The logits against the float64 reference (ref_model.py) on every weight type, the int8 path, greedy
generation, quantize and the refusals of prune and --tp/--pp are test_families' (the hybrids are in
mf.FAMILIES).  Here:

  * chunking: `kvant logits` with 1, 5 and 24 tokens per pass is bitwise the same (the recurrence
    runs token by token in each sequence's state slot, whatever the pass);
  * the prefix cache through the server: a hit restores the recurrent state from a snapshot at a
    block boundary (the last one the earlier request's pass reached, or every
    --state-snapshot-every blocks), computes the rest, and the greedy outputs equal those of a
    server without a prefix cache; the hit is cut back to the snapshot (usage.cached_tokens);
  * an 8-turn conversation (each prompt the last one plus more tokens) hits at least 90% of what
    the same conversation hits on a dense model (llama3 of the same shape);
  * concurrency, preemption (a KV pool too small for the batch: the state is recomputed) and n > 1
    (each fork gets its parent's state) give the same outputs as one request at a time;
  * a restart with a disk tier: the snapshot comes back from <kv-disk-dir>/state;
  * /metrics and /v1/memory report the state slots, and the memory category "state" equals them;
  * refusals: --spec, a request's kv_budget.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import subprocess

import httpx
import numpy as np
import pytest

import make_family as mf
from server_util import THREADS, KvantServer

FAMS = mf.HYBRID_FAMILIES
BASE = ["-t", THREADS, "-c", "256"]
BS = 16


@pytest.fixture(scope="module")
def hyb_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("hybrids"))


def _ids(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, mf.ms.N_VOCAB, size=n)]


def _complete(srv: KvantServer, prompt: list[int], n_tok: int = 12, **extra) -> dict:
    body = {"model": srv.model_name, "prompt": prompt, "max_tokens": n_tok, "temperature": 0,
            **extra}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _server(kvant_bin, path, *args, base=None) -> KvantServer:
    srv = KvantServer(kvant_bin, path, *args, base_args=BASE if base is None else base)
    srv.model_name = httpx.get(srv.url + "/v1/models").json()["data"][0]["id"]
    return srv


def _metric(srv: KvantServer, name: str) -> float:
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not on /metrics")


@pytest.mark.parametrize("family", FAMS)
def test_chunking_bitwise(family, hyb_dir, run_kvant, tmp_path):
    path = mf.make_family(hyb_dir, family, "Q8_0")
    ids = _ids(7, 24)
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)) + "\n")
    outs = []
    for b in ("1", "5", "24"):
        for exact in ([], ["--exact"]):
            out = tmp_path / f"o{b}{len(exact)}.f32"
            r = run_kvant(["logits", "-m", path, "--tokens-file", tmp_path / "ids.txt", "--out", out,
                           "-t", "2", "-b", b, *exact])
            assert r.returncode == 0, r.stderr[-2000:]
            outs.append((b, len(exact), np.fromfile(out, dtype="<f4")))
    for b, ex, a in outs[2:]:
        ref = outs[ex][2]
        assert np.array_equal(a, ref), f"{family}: -b {b} (exact {ex}) differs from -b 1"


def _prompts():
    base = _ids(11, 100)
    return {"full": base, "again": base, "prefix70": base[:70] + _ids(12, 9),
            "longer": base + _ids(13, 30), "other": _ids(14, 60)}


@pytest.mark.parametrize("family", FAMS)
def test_prefix_hit_restores_state(family, hyb_dir, kvant_bin):
    """Snapshots every 2 blocks (32 tokens) and at each pass's last boundary: the repeated prompt
    hits 96 tokens (its pass ended at 100: snapshot at 96), the 79-token prompt sharing 70 tokens
    hits 64 (the permanent snapshot; the KV blocks alone would give 64 too), the longer one 96, and
    every greedy output equals a server without a prefix cache."""
    path = mf.make_family(hyb_dir, family, "F32")
    ps = _prompts()
    ref = _server(kvant_bin, path, "--no-prefix-cache")
    try:
        want = {k: _complete(ref, p)["choices"][0]["text"] for k, p in ps.items()}
    finally:
        ref.stop()
    srv = _server(kvant_bin, path, "--state-snapshot-every", "2")
    try:
        got = {k: _complete(srv, p) for k, p in ps.items()}
        cached = {k: g["usage"]["prompt_tokens_details"]["cached_tokens"] for k, g in got.items()}
        for k in ps:
            assert got[k]["choices"][0]["text"] == want[k], f"{family} {k}: output differs"
        assert cached == {"full": 0, "again": 96, "prefix70": 64, "longer": 96, "other": 0}, cached
        assert _metric(srv, "kvant_state_snapshot_restores_total") == 3
        assert _metric(srv, "kvant_state_snapshots") >= 4
        mem = httpx.get(srv.url + "/v1/memory").json()
        st = mem["kv"]["recurrent_state"]
        assert st["slot_bytes"] > 0 and st["snapshots"] >= 4 and st["snapshot_restores_total"] == 3
        assert st["bytes_reserved"] == st["slot_bytes"] * (st["live_slots"] + st["snapshot_slots"])
        assert mem["categories"]["state"]["current"] == st["bytes_reserved"]
        assert _metric(srv, 'kvant_device_memory_bytes{category="state"}') == st["bytes_reserved"]
    finally:
        srv.stop()


def _conversation(srv: KvantServer, turns: int = 8) -> tuple[int, int, list[str]]:
    """Each turn's prompt: the last prompt, 6 'assistant' tokens, 18 new ones (the context is 256)."""
    prompt, hit, total, texts = _ids(21, 40), 0, 0, []
    for t in range(turns):
        r = _complete(srv, prompt, n_tok=12)
        hit += r["usage"]["prompt_tokens_details"]["cached_tokens"]
        total += len(prompt)
        texts.append(r["choices"][0]["text"])
        prompt = prompt + _ids(100 + t, 6) + _ids(200 + t, 18)
    return hit, total, texts


@pytest.mark.parametrize("family", FAMS)
def test_multiturn_hit_rate(family, hyb_dir, kvant_bin):
    dense = mf.make_family(hyb_dir, "llama3", "F32")
    srv = _server(kvant_bin, dense)
    try:
        d_hit, d_total, _ = _conversation(srv)
    finally:
        srv.stop()
    path = mf.make_family(hyb_dir, family, "F32")
    srv = _server(kvant_bin, path)
    try:
        h_hit, h_total, texts = _conversation(srv)
    finally:
        srv.stop()
    ref = _server(kvant_bin, path, "--no-prefix-cache")
    try:
        _, _, want = _conversation(ref)
    finally:
        ref.stop()
    assert texts == want
    assert d_total == h_total and d_hit > 0.5 * d_total
    assert h_hit >= 0.9 * d_hit, f"{family}: {h_hit} of {h_total} against dense {d_hit}"


@pytest.mark.parametrize("family", FAMS)
def test_concurrency_preemption_forks(family, hyb_dir, kvant_bin):
    """Six prompts at once on a pool of 12 blocks (preemptions: each holds up to 6), and n = 3:
    the same greedy outputs as one request at a time on a roomy server."""
    path = mf.make_family(hyb_dir, family, "F32")
    prompts = [_ids(300 + i, 40 + 7 * i) for i in range(6)]
    ref = _server(kvant_bin, path, "--no-prefix-cache")
    try:
        want = [_complete(ref, p, n_tok=24)["choices"][0]["text"] for p in prompts]
        want_n1 = _complete(ref, prompts[0], n_tok=10)["choices"][0]["text"]
    finally:
        ref.stop()
    # --max-itl-ms 0: steps sized by tokens only, so the preemptions do not depend on timing
    srv = _server(kvant_bin, path, "--kv-blocks", "12", "--max-num-seqs", "4", "--max-itl-ms", "0")
    try:
        with cf.ThreadPoolExecutor(6) as ex:
            got = list(ex.map(lambda p: _complete(srv, p, n_tok=24)["choices"][0]["text"], prompts))
        assert got == want
        # the six as one prompt list: admitted together, so they must preempt (separate HTTP
        # requests may arrive far enough apart to run without)
        r = _complete(srv, prompts, n_tok=24)
        assert [c["text"] for c in sorted(r["choices"], key=lambda c: c["index"])] == want
        assert _metric(srv, "kvant_num_preemptions_total") > 0
        r = _complete(srv, prompts[0], n_tok=10, n=3)
        assert [c["text"] for c in r["choices"]] == [want_n1] * 3
    finally:
        srv.stop()


@pytest.mark.parametrize("family", FAMS)
def test_disk_tier_restart(family, hyb_dir, kvant_bin, tmp_path):
    path = mf.make_family(hyb_dir, family, "F32")
    prompt = _ids(31, 90)
    args = ["--kv-disk-dir", str(tmp_path / "kv"), "--kv-host-memory", "64M"]
    srv = _server(kvant_bin, path, *args)
    try:
        first = _complete(srv, prompt)
    finally:
        assert srv.stop(signal.SIGTERM) == 0
    assert any((tmp_path / "kv" / "state").iterdir()), "no snapshot record on disk"
    srv = _server(kvant_bin, path, *args)
    try:
        again = _complete(srv, prompt)
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 80
        assert _metric(srv, "kvant_state_snapshot_tier_restores_total") == 1
    finally:
        srv.stop()


def test_refusals(hyb_dir, kvant_bin, run_kvant):
    path = mf.make_family(hyb_dir, "granite-h", "F32")
    r = subprocess.run([kvant_bin, "serve", "-m", path, "--port", "0", *BASE, "--spec", "ngram"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--spec: speculative decoding is not for hybrid" in r.stderr, \
        r.stderr[-2000:]
    srv = _server(kvant_bin, path)
    try:
        body = {"model": srv.model_name, "prompt": _ids(1, 100), "max_tokens": 4, "kv_budget": 48}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 400 and "kv_budget" in r.text and "hybrid" in r.text, r.text
        assert _complete(srv, _ids(2, 20))["usage"]["completion_tokens"] == 12  # still serving
    finally:
        srv.stop()
    r = run_kvant(["plan", "-m", path, "--json", "--max-num-seqs", "8"])
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plans"][0]["plan"]
    # 4 recurrent layers: conv rows (3 x (512 + 2 x 2 x 16)) and scan state (512 x 16), f32
    slot = 4 * (3 * (512 + 64) + 512 * 16) * 4
    assert plan["state_slot_bytes"] == slot and plan["state_slots"] == 8 + 8 + 16
    assert plan["state_bytes"] == slot * 32


@pytest.mark.parametrize("family", FAMS)
def test_info_recipe(family, hyb_dir, run_kvant):
    """`kvant info` names the recurrent layers make_family wrote (every layer not attention nor
    MLP) and one sequence's state bytes (`kvant plan`'s slot)."""
    path = mf.make_family(hyb_dir, family, "F32")
    r = run_kvant(["info", "-m", path, "--json"])
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)["recipe"]
    sh = mf.TINY[family]
    want = [i for i in range(sh.n_layer) if i not in sh.recr.attn and i not in sh.recr.mlp]
    assert rec["recurrent_layers"] == want and rec["recurrent"] != "none"
    p = run_kvant(["plan", "-m", path, "--json"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["plans"][0]["plan"]["state_slot_bytes"] == rec["state_bytes"]


@pytest.mark.parametrize("family", FAMS)
def test_weight_offload_bitwise(family, hyb_dir, run_kvant, tmp_path):
    """Layers streamed under --weights-memory (the recurrent tensors with them) give the resident
    logits bitwise."""
    path = mf.make_family(hyb_dir, family, "F32")
    (tmp_path / "ids.txt").write_text(" ".join(map(str, _ids(9, 24))) + "\n")
    outs = []
    for extra in ([], ["--weights-memory", "0.8"]):
        out = tmp_path / f"o{len(extra)}.f32"
        r = run_kvant(["logits", "-m", path, "--tokens-file", tmp_path / "ids.txt", "--out", out,
                       "-t", "2", "--exact", "--kv-dtype", "f32", *extra])
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(np.fromfile(out, dtype="<f4"))
    assert "streams" in r.stderr or "stream" in r.stderr, r.stderr[-2000:]
    assert np.array_equal(outs[0], outs[1])


def test_several_models_one_budget(hyb_dir, kvant_bin):
    """Hybrids beside a dense model in one budget (the registry counts their state slots in
    each model's footprint): every model answers, and the state category holds the loaded
    hybrids' slots."""
    paths = {f: mf.make_family(hyb_dir, f, "F32") for f in ("granite-h", "qwen35", "llama3")}
    srv = KvantServer(kvant_bin, f"g={paths['granite-h']}", "-m", f"q={paths['qwen35']}", "-m",
                      f"d={paths['llama3']}", "--device-memory", "400M", base_args=BASE)
    try:
        for name in ("g", "q", "d", "g"):
            body = {"model": name, "prompt": _ids(5, 20), "max_tokens": 4, "temperature": 0}
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
        mem = httpx.get(srv.url + "/v1/memory").json()
        assert mem["categories"]["state"]["current"] > 0
    finally:
        srv.stop()
