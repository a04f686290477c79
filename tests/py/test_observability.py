"""What the memory is used for: metric names by Prometheus conventions (checked by promtool),
per-request KV in `usage`, GET /v1/memory (requests holding blocks), GET /v1/memory/blocks
(run-length block map), /ready, /dashboard served from the binary with no outside reference.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import threading

import httpx
import pytest

from server_util import KvantServer, server  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def model_name(server):
    return httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]

BS = 16


def decode_runs(m: dict) -> list[tuple[int, int, int]]:
    """Block map -> [(state, request, refcount)] per block."""
    r = m["runs"]
    assert len(r) % 4 == 0
    out = []
    for i in range(0, len(r), 4):
        out += [(r[i], r[i + 1], r[i + 2])] * r[i + 3]
    return out


def test_metric_names_follow_prometheus_conventions(server):
    text = httpx.get(server.url + "/metrics", timeout=10).text
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert types, text[:500]
    for name, typ in types.items():
        assert name.startswith("kvant_") and ":" not in name, name
        if typ == "counter":
            assert name.endswith("_total"), name
        else:
            assert not name.endswith("_total"), name
    for need in ("kvant_num_requests_waiting", "kvant_num_requests_running", "kvant_kv_usage_ratio",
                 "kvant_kv_block_size_bytes", "kvant_ready"):
        assert types.get(need) == "gauge", need
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: install the Debian package `prometheus` (setup-deps)",
                    pytrace=False)
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert p.returncode == 0 and not p.stdout.strip(), p.stdout + p.stderr


def test_usage_carries_kv(server, model_name):
    m = server.metrics()
    block_bytes = m["kvant_kv_block_size_bytes"]
    assert block_bytes > 0
    body = {"model": model_name, "prompt": "Count the stars in the sky tonight", "max_tokens": 21,
            "temperature": 0, "ignore_eos": True}
    u = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["usage"]
    stored = u["prompt_tokens"] + u["completion_tokens"] - 1  # the last token is never computed
    assert u["kv_tokens"] == stored, u
    assert u["kv_blocks"] == -(-stored // BS), u
    assert u["kv_bytes"] == u["kv_blocks"] * block_bytes, u
    # n = 2: the prompt's full blocks are shared, counted once
    body.update(n=2, temperature=1.0, seed=3, prompt="x " * 40)
    u2 = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["usage"]
    per_seq = u2["prompt_tokens"] + 21 - 1
    full_prompt_blocks = u2["prompt_tokens"] // BS
    assert u2["kv_blocks"] == 2 * -(-per_seq // BS) - full_prompt_blocks, u2
    assert u2["kv_tokens"] == 2 * per_seq - full_prompt_blocks * BS, u2


def test_usage_in_stream(server, model_name):
    body = {"model": model_name, "prompt": "Streaming usage", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    usage = None
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                import json
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage and usage["kv_tokens"] == usage["prompt_tokens"] + 5 - 1, usage


def test_memory_lists_running_requests_and_block_map(server, model_name):
    m0 = server.metrics()
    body = {"model": model_name, "prompt": "Tell me a very long story about memory.",
            "max_tokens": 1200, "stream": True, "ignore_eos": True}
    seen = {}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        n = 0
        for line in r.iter_lines():  # (leaving this loop closes the stream: cancel)
            n += line.startswith("data: ")
            if n == 40:
                mem = httpx.get(server.url + "/v1/memory", timeout=10).json()
                bm = httpx.get(server.url + "/v1/memory/blocks", timeout=10).json()
                after = httpx.get(server.url + "/v1/memory", timeout=10).json()
                seen = {"mem": mem, "bm": bm, "after": after}
                break
    mem, bm, after = seen["mem"], seen["bm"], seen["after"]
    assert mem["engine"]["running"] >= 1 and mem["kv"]["blocks"] == 1024
    pr = mem["process"]
    assert pr["rss_bytes"] > 0
    # what /v1/memory names: the manager's resident bytes, the engine's host buffers, code
    assert pr["device_path_resident_bytes"] <= pr["device_path_bytes"]
    assert pr["named_bytes"] == (pr["device_path_resident_bytes"] + pr["engine_host_bytes"]
                                 + pr["code_bytes"]), pr
    assert pr["engine_host_bytes"] > 2 * 4 * 49152 and pr["code_bytes"] > (1 << 20), pr
    print(f"named {pr['named_bytes'] / 1e6:.1f} MB of RSS {pr['rss_bytes'] / 1e6:.1f} MB "
          f"({pr['named_share']:.3f})")
    assert 0.97 <= pr["named_share"] <= 1.05, pr
    reqs = [q for q in mem["requests"] if q["generated_tokens"] >= 30]
    assert reqs, mem["requests"]
    q = reqs[0]
    ids = [b for first, cnt in q["blocks"] for b in range(first, first + cnt)]
    assert len(ids) == len(set(ids)) == q["blocks_own"] + q["blocks_shared"]
    assert q["kv_bytes"] == len(ids) * mem["kv"]["block_bytes"]
    assert q["kv_tokens"] > q["prompt_tokens"]
    blocks = decode_runs(bm)
    assert len(blocks) == bm["n_blocks"] == 1024
    assert bm["states"][:3] == ["free", "used", "cached"]
    assert mem["kv"]["used"] >= len(ids)  # same snapshot
    # the block map a moment later: the request still runs (it streams 1200 tokens), so its
    # blocks are still its own (blocks never move while a request runs)
    assert any(r["id"] == q["id"] for r in after["requests"]), (q, after["requests"], after["engine"])
    # the request's blocks were used by it a moment before (it only grows while streaming)
    later_owned = {i for i, (st, req, rc) in enumerate(blocks) if req == q["id"]}
    assert set(ids) <= later_owned, (ids, sorted(later_owned)[:20])
    for st, req, rc in blocks:
        assert (bm["states"][st] == "used") == (rc > 0) == (req > 0)
    m1 = server.wait_idle(m0["kvant_kv_blocks_used"])
    bm1 = httpx.get(server.url + "/v1/memory/blocks", timeout=10).json()
    assert not any(req for _, req, _ in decode_runs(bm1)) or m1["kvant_kv_blocks_used"] > 0


def test_memory_snapshots_under_concurrency(server, model_name):
    """Many readers while requests run: every snapshot is self-consistent."""
    errors = []

    def gen():
        body = {"model": model_name, "prompt": "Concurrency", "max_tokens": 60, "ignore_eos": True}
        httpx.post(server.url + "/v1/completions", json=body, timeout=120)

    def read():
        for _ in range(20):
            bm = httpx.get(server.url + "/v1/memory/blocks", timeout=30).json()
            blocks = decode_runs(bm)
            if len(blocks) != bm["n_blocks"]:
                errors.append("count")
            if any((rc > 0) != (req > 0) for _, req, rc in blocks):
                errors.append("owner/refcount")
    ts = [threading.Thread(target=gen) for _ in range(4)] + [threading.Thread(target=read) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_dashboard_is_self_contained(server):
    r = httpx.get(server.url + "/dashboard", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "<canvas id=\"map\"" in html
    assert not re.search(r"(src|href)\s*=|@import|url\(|https?://|//[a-z0-9.-]+\.[a-z]{2,}", html,
                         re.I), "the dashboard references something outside the server"
    assert "connect-src 'self'" in r.headers["content-security-policy"]


def test_ready_and_auth(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model, "--api-key", "k3y")
    try:
        assert httpx.get(s.url + "/ready").json() == {"status": "ready"}
        assert httpx.get(s.url + "/dashboard").status_code == 200  # the page is static
        assert httpx.get(s.url + "/v1/memory/blocks").status_code == 401
        assert httpx.get(s.url + "/v1/memory/blocks",
                         headers={"Authorization": "Bearer k3y"}).status_code == 200
        assert httpx.post(s.url + "/ready").status_code == 405
    finally:
        assert s.stop() == 0
