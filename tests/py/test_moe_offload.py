"""Experts placed by memory in the server (model/xcache.h): a mixture of experts under
--weights-memory below its size keeps its dense weights resident and its experts in a cache of
slots read from the model file.  The answers are bitwise those of the resident model; /metrics
counts hits, misses and bytes read per (layer, expert); /v1/memory shows which experts are
resident."""
from __future__ import annotations

import httpx
import pytest

import make_family as mf
from server_util import KvantServer

PROMPTS = ["hello there my friend", "the quick brown fox jumps", "1 2 3 4 5 6 7 8 9"]


def _complete(srv: KvantServer, prompt: str) -> httpx.Response:
    return httpx.post(srv.url + "/v1/completions", timeout=120,
                      json={"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1})


def _answers(srv: KvantServer) -> list:
    out = []
    for p in PROMPTS:
        r = _complete(srv, p)
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]
        out.append((lp["tokens"], lp["token_logprobs"]))
    return out


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory) -> str:
    return mf.make_family(str(tmp_path_factory.mktemp("moe")), "olmoe", "Q4_0")


def test_served_from_the_cache(kvant_bin, olmoe):
    srv = KvantServer(kvant_bin, olmoe, "-c", "256")
    try:
        want = _answers(srv)
    finally:
        assert srv.stop() == 0, srv.log_text()
    srv = KvantServer(kvant_bin, olmoe, "-c", "256", "--weights-memory", "1M")   # 2 of 16 experts
    try:
        got = _answers(srv)
        m = srv.metrics()
        mem = httpx.get(srv.url + "/v1/memory", timeout=10).json()["weights_offload"]
    finally:
        assert srv.stop() == 0, srv.log_text()
    assert got == want
    assert "experts placed by memory: 2 of 16" in srv.log_text()
    # O_DIRECT reads (where the file system refuses them, the page cache and a note): the same
    srv2 = KvantServer(kvant_bin, olmoe, "-c", "256", "--weights-memory", "1M", "--stream-io",
                       "direct")
    try:
        assert _answers(srv2) == want
        ex2 = httpx.get(srv2.url + "/v1/memory", timeout=10).json()["weights_offload"]["experts"]
    finally:
        assert srv2.stop() == 0, srv2.log_text()
    assert "kvant: expert reads: " in srv2.log_text()
    assert ex2["direct"] or "O_DIRECT refused" in ex2["io_note"], ex2
    assert ex2["misses"] > 0 and ex2["read_bytes"] > 0
    hits = sum(v for k, v in m.items() if k.startswith("kvant_moe_expert_hits_total{"))
    misses = sum(v for k, v in m.items() if k.startswith("kvant_moe_expert_misses_total{"))
    assert misses > 0 and m["kvant_moe_expert_read_bytes_total"] > 0
    assert m["kvant_moe_expert_cache_slots"] == 2 and m["kvant_moe_experts_resident"] <= 2
    ex = mem["experts"]
    assert mem["mode"] == "experts" and ex["slots"] == 2
    assert ex["hits"] == hits and ex["misses"] == misses
    assert sum(len(layer["resident"]) for layer in ex["layers"]) == ex["resident"] <= 2
    assert 0 < ex["read_bytes"] <= ex["misses"] * ex["slot_bytes"]


def test_layer_options_refused(kvant_bin, olmoe, run_kvant, tmp_path):
    """Layer streaming's options mean nothing to the expert cache: refused, naming them."""
    (tmp_path / "ids.txt").write_text("1 2 3\n")
    base = ["logits", "-m", olmoe, "--tokens-file", tmp_path / "ids.txt", "--out",
            tmp_path / "o.f32", "--weights-memory", "1M"]
    for extra, name in ((["--stream-io", "both"], "--stream-io both"),
                        (["--weights-place", "tail"], "--weights-place"),
                        (["--stream-buffers", "3"], "--stream-buffers")):
        r = run_kvant(base + extra)
        assert r.returncode == 1 and name in r.stderr, (extra, r.stderr)
    r = run_kvant(["plan", "-m", olmoe, "--weights-memory", "1M", "--weights-place", "spread"])
    assert r.returncode == 1 and "--weights-place" in r.stderr, r.stderr


@pytest.mark.parametrize("io", ["buffered", "direct"])
def test_truncated_experts(kvant_bin, tmp_path, io):
    """A file cut short under the server in its experts (written last here, so the mapped dense
    weights stay whole): each request that needs a lost expert fails with a 500 naming the short
    read, the server keeps running, /health turns 503 and /metrics and /v1/memory say why; the
    same with the experts read by O_DIRECT (the aligned region past the end comes back short)."""
    import os
    import signal

    from gguf import GGUFReader

    path = str(tmp_path / "olmoe-tail.gguf")
    mf.write_family(path, "olmoe", "Q4_0", seed=5, experts_last=True)
    r = GGUFReader(path)
    down = next(t for t in r.tensors if t.name == "blk.1.ffn_down_exps.weight")
    assert down.data_offset + down.n_bytes == os.path.getsize(path)   # the file's last bytes
    cut = int(down.data_offset + down.n_bytes // 2)
    del r
    srv = KvantServer(kvant_bin, path, "-c", "256", "--weights-memory", "1M", "--stream-io", io)
    try:
        assert _complete(srv, PROMPTS[0]).status_code == 200
        os.truncate(path, cut)   # layer 1's last experts' down rows are gone
        codes, errors = [], []
        for p in PROMPTS + ["one two three four", "abc def ghi"]:
            resp = _complete(srv, p)
            codes.append(resp.status_code)
            if resp.status_code != 200:
                errors.append(resp.json()["error"]["message"])
        assert 500 in codes and all(c in (200, 500) for c in codes), codes
        assert all("short read" in e and "truncated or replaced" in e for e in errors), errors
        h = httpx.get(srv.url + "/health", timeout=10)
        assert h.status_code == 503 and "expert cache" in h.text, h.text
        assert srv.metrics()["kvant_moe_expert_cache_failed"] == 1
        ex = httpx.get(srv.url + "/v1/memory", timeout=10).json()["weights_offload"]["experts"]
        assert ex["failed"] and "short read" in ex["error"]
        assert ex["direct"] == (io == "direct") or "O_DIRECT refused" in ex["io_note"], ex
        assert srv.proc.poll() is None, "the server died"
    finally:
        rc = srv.stop()
        assert rc == 0, srv.log_text()
    assert rc != -signal.SIGBUS
