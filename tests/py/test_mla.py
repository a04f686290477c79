"""deepseek2's latent KV cache in the server: one row of kv_lora_rank + rope values per token
and layer (V is read from that row), measured through /v1/memory and usage; prefix caching
and the disk tier over the one-plane blocks; what latent attention refuses.

The model is make_family's deepseek2-lite: DeepSeek-V2-Lite's KV shape (27 layers,
kv_lora_rank 512, rope 64) at n_embd 64 with 2 heads (the cache row does not depend on the
head count: that is the point of latent attention).  Decompressed, its 16 heads would keep
16 x (192 + 128) values per token and layer: 5,120 against 576.
"""
from __future__ import annotations

import httpx
import pytest

import make_family as mf
from server_util import KvantServer

LAYERS, KV_LORA, ROPE = 27, 512, 64
ROW = KV_LORA + ROPE
PROMPT = " ".join(f"w{i % 17}" for i in range(120))


@pytest.fixture(scope="module")
def lite(tmp_path_factory) -> str:
    return mf.make_family(str(tmp_path_factory.mktemp("mla")), "deepseek2-lite", "F16")


def complete(srv: KvantServer, prompt: str = PROMPT, **kw) -> dict:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1, **kw}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("kv_dtype,row_bytes", [("f16", ROW * 2), ("q8_0", ROW // 32 * 34)])
def test_latent_kv_bytes(kvant_bin, lite, kv_dtype, row_bytes):
    """KV bytes per token = (kv_lora_rank + rope dims) x layers x element size, exactly: the
    pool's blocks (/v1/memory) and a request's footprint (usage.kv_bytes)."""
    srv = KvantServer(kvant_bin, lite, "--kv-dtype", kv_dtype)
    try:
        mem = httpx.get(srv.url + "/v1/memory", timeout=10).json()
        out = complete(srv)
    finally:
        assert srv.stop() == 0, srv.log_text()
    kv = mem["kv"]
    per_token = LAYERS * row_bytes
    assert kv["block_bytes"] == kv["block_size"] * per_token, (kv, per_token)
    u = out["usage"]
    assert u["kv_tokens"] >= u["prompt_tokens"] and u["kv_blocks"] > 0
    assert u["kv_bytes"] == u["kv_blocks"] * kv["block_bytes"], u
    # within 1% of the tokens held (blocks round up)
    assert abs(u["kv_bytes"] / (u["kv_blocks"] * kv["block_size"]) - per_token) <= 0.01 * per_token


def answer(out: dict) -> tuple:
    """The greedy tokens and their log-probabilities (the random model's text is byte fragments)."""
    lp = out["choices"][0]["logprobs"]
    return tuple(lp["tokens"]), tuple(lp["token_logprobs"])


def test_prefix_cache_and_disk_tier(kvant_bin, lite, tmp_path):
    """A repeated prompt hits the prefix cache with the same greedy answer; after a restart its
    one-plane blocks come back from the disk tier, still the same answer."""
    disk = ["--kv-disk-dir", str(tmp_path / "tier"), "--kv-disk-size", "64M"]
    srv = KvantServer(kvant_bin, lite, *disk)
    try:
        first, again = complete(srv), complete(srv)
    finally:
        assert srv.stop() == 0, srv.log_text()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert answer(again) == answer(first)
    srv = KvantServer(kvant_bin, lite, *disk)
    try:
        back = complete(srv)
        m = srv.metrics()
    finally:
        assert srv.stop() == 0, srv.log_text()
    assert back["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert m["kvant_kv_tier_hit_tokens_total{tier=disk}"] > 0
    assert answer(back) == answer(first)


def test_refusals(kvant_bin, lite, run_kvant):
    """Scores per head (snapkv, h2o) do not exist for one latent row: refused naming the field,
    the server keeps serving; --kv-rotate is refused (the latent row is stored as it is)."""
    srv = KvantServer(kvant_bin, lite)
    try:
        for policy in ("snapkv", "h2o"):
            r = httpx.post(srv.url + "/v1/completions", timeout=60,
                           json={"prompt": PROMPT, "max_tokens": 4, "kv_budget": 64,
                                 "kv_policy": policy})
            assert r.status_code == 400 and "kv_policy" in r.text and "latent" in r.text, r.text
        assert complete(srv)["usage"]["completion_tokens"] >= 1   # still serving
    finally:
        assert srv.stop() == 0, srv.log_text()
    r = run_kvant(["run", "-m", lite, "-p", "hi", "-n", "2", "--kv-rotate"])
    assert r.returncode > 0 and "--kv-rotate" in r.stderr and "latent" in r.stderr, r.stderr
