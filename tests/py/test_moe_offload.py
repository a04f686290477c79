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
    hits = sum(v for k, v in m.items() if k.startswith("kvant_moe_expert_hits_total{"))
    misses = sum(v for k, v in m.items() if k.startswith("kvant_moe_expert_misses_total{"))
    assert misses > 0 and m["kvant_moe_expert_read_bytes_total"] > 0
    assert m["kvant_moe_expert_cache_slots"] == 2 and m["kvant_moe_experts_resident"] <= 2
    ex = mem["experts"]
    assert mem["mode"] == "experts" and ex["slots"] == 2
    assert ex["hits"] == hits and ex["misses"] == misses
    assert sum(len(layer["resident"]) for layer in ex["layers"]) == ex["resident"] <= 2
    assert 0 < ex["read_bytes"] <= ex["misses"] * ex["slot_bytes"]
