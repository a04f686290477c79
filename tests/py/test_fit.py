"""Memory that fits itself (README "Tuning memory", docs/ARCHITECTURE.md "Memory model").

- The KV pool on the CPU is sized from demand, not from all of RAM: `kvant serve` with no
  memory flags reserves PLAN_KV_FIT_START (256 MiB) of KV at start on the default model, far
  under the host's RAM; /v1/memory and /metrics report reserved, resident (mincore over the
  pool) and in use apart, and resident follows the blocks actually written.
- The pool grows on demand: more concurrent KV than the start size holds is served without
  preemption, with the same greedy tokens as a server whose pool took the whole budget at
  start (--kv-pool budget).
- `kvant plan --json` = what `serve` allocates, bytes per category (/v1/memory), for a model
  that fits and for one that needs weight offload: weights, activations, the KV pool (less
  the block the CPU backend holds back for its attention scratch when the pool is bound by
  the budget), the context and the layer placement.
- A model twice the budget runs with no flag beyond --device-memory (the planner streams the
  layers that do not fit): greedy tokens and logprobs equal to the resident server's, and
  `kvant logits` bitwise equal; --no-offload restores the refusal.
- Context auto: the model's context that does not fit one request becomes the largest that
  does (printed); an explicit -c that does not fit is refused naming the largest.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess

import httpx

from server_util import KvantServer

THREADS = os.environ.get("KVANT_THREADS", "2")
MiB = 1 << 20
FIT_START = 256 * MiB  # PLAN_KV_FIT_START (src/mem/plan.h)
# a budget half the default model's 92 MiB of weights, with a small workspace and context
TWICE = ["-c", "256", "--max-num-seqs", "2", "--max-num-batched-tokens", "64"]
TWICE_DEV = ["--device-memory", "51MiB"]
FITS = ["-c", "2048", "--max-num-seqs", "8"]


def memory(srv) -> dict:
    r = httpx.get(srv.url + "/v1/memory", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def plan(kvant_bin, model, *args) -> dict:
    r = subprocess.run([kvant_bin, "plan", "-m", model, "-t", THREADS, "--json", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def served_ctx(srv) -> int:
    m = re.search(r"context (\d+) tokens; try", srv.log_text())
    assert m, srv.log_text()
    return int(m.group(1))


def host_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def complete(srv, i, n_prompt=20, max_tokens=6):
    prompt = [(i * 7919 + j * 31 + 11) % 40000 + 100 for j in range(n_prompt)]
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1,
            "ignore_eos": True}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    return c["text"], c["logprobs"]["token_logprobs"]


def test_default_pool_reserved_is_not_ram(kvant_bin, default_model):
    srv = KvantServer(kvant_bin, default_model, base_args=["-t", THREADS])
    try:
        m = memory(srv)
        kv, met = m["kv"], srv.metrics()
        # reserved at start: 256 MiB worth of whole blocks (one 8192-token request is less)
        assert kv["bytes_reserved"] == kv["blocks"] * kv["block_bytes"]
        assert kv["blocks"] == FIT_START // kv["block_bytes"], kv
        assert kv["bytes_reserved"] < host_available() / 16
        assert kv["bytes_reserved"] < m["budget"] / 16  # before: all the budget left
        assert kv["blocks_max"] > kv["blocks"] and kv["bytes_used"] == 0
        assert m["categories"]["kv"]["current"] == kv["bytes_reserved"]
        assert kv["bytes_resident"] <= kv["bytes_reserved"]
        assert met["kvant_kv_reserved_bytes"] == kv["bytes_reserved"]
        assert met["kvant_kv_resident_bytes"] <= kv["bytes_reserved"]
        assert met["kvant_kv_blocks_max"] == kv["blocks_max"]
        touched0 = kv["bytes_resident"]
        # a 600-token request writes about 38 blocks: their pages become resident, the
        # rest of the reservation stays untouched
        complete(srv, 1, n_prompt=600, max_tokens=4)
        kv = memory(srv)["kv"]
        assert kv["bytes_resident"] - touched0 >= 36 * kv["block_bytes"], kv
        assert kv["bytes_resident"] < kv["bytes_reserved"] / 4, kv
        assert kv["grows_total"] == 0
        cat = memory(srv)["categories"]
        assert all(c["resident"] <= c["current"] for c in cat.values()), cat
    finally:
        assert srv.stop() == 0, srv.log_text()
    assert "KV pool sized from demand (host memory)" in srv.log_text()


def test_pool_grows_on_demand_same_tokens(kvant_bin, default_model):
    # f32 KV, 16-token blocks; --kv-start 1MiB is less than one request of the context, so
    # the pool starts at one request (512 / 16 = 32 blocks); 4 requests of 400 tokens need
    # 4 x 26 = 104
    args = ["-t", THREADS, "-c", "512", "--max-num-seqs", "4", "--kv-dtype", "f32",
            "--kv-start", "1MiB"]

    def run(srv):
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            return list(ex.map(lambda i: complete(srv, i, n_prompt=400, max_tokens=8), range(4)))

    srv = KvantServer(kvant_bin, default_model, base_args=args)
    try:
        start = memory(srv)["kv"]
        assert start["blocks"] == 512 // 16 and start["block_bytes"] > 1 << 19, start
        got = run(srv)
        m = memory(srv)
        met = srv.metrics()
    finally:
        assert srv.stop() == 0, srv.log_text()
    kv = m["kv"]
    assert kv["grows_total"] >= 1 and start["blocks"] < kv["blocks"] <= kv["blocks_max"], kv
    assert met["kvant_num_preemptions_total"] == 0
    assert m["categories"]["kv"]["current"] == kv["blocks"] * kv["block_bytes"]
    ref_srv = KvantServer(kvant_bin, default_model, "--kv-pool", "budget", base_args=args)
    try:
        assert memory(ref_srv)["kv"]["blocks"] > 1000
        ref = run(ref_srv)
    finally:
        assert ref_srv.stop() == 0
    assert got == ref


def check_plan_is_allocation(kvant_bin, model, args, offload):
    p = plan(kvant_bin, model, *args)
    pl = p["plans"][0]["plan"]
    srv = KvantServer(kvant_bin, model, *args, base_args=["-t", THREADS])
    try:
        m = memory(srv)
        ctx = served_ctx(srv)
    finally:
        assert srv.stop() == 0, srv.log_text()
    cat, kv = m["categories"], m["kv"]
    assert cat["weights"]["current"] == pl["weights_bytes"], (cat, pl)
    assert cat["activations"]["current"] == pl["activation_bytes"], (cat, pl)
    assert ctx == pl["ctx"]
    assert kv["block_bytes"] == pl["kv_bytes_per_token"] * pl["block_size"]
    assert kv["blocks_max"] <= pl["kv_pool_blocks"]
    if pl["kv_start_blocks"] < pl["kv_pool_blocks"]:  # bound by demand: exactly the plan
        assert kv["blocks"] == pl["kv_start_blocks"] and cat["kv"]["current"] == pl["kv_start_bytes"]
    else:  # bound by the budget: less the block held for the backend's attention scratch
        assert 0 <= pl["kv_start_blocks"] - kv["blocks"] <= 1, (kv, pl)
    assert p["weights_auto"] == offload
    if offload:
        po, so = p["weights_offload"], m["weights_offload"]
        assert so["enabled"] and po["offload"]
        assert [x["placement"] for x in po["layers"]] == [x["placement"] for x in so["layers"]]
        assert so["resident_bytes"] == po["resident_bytes"]
        assert so["staging_bytes"] == po["staging_bytes"]
    else:
        assert not m["weights_offload"]["enabled"]
    return pl, m


def test_plan_is_allocation_fits(kvant_bin, default_model):
    pl, _ = check_plan_is_allocation(kvant_bin, default_model, FITS, offload=False)
    assert pl["kv_fit"] and pl["kv_start_blocks"] < pl["kv_pool_blocks"]


def test_plan_is_allocation_offload(kvant_bin, default_model):
    pl, m = check_plan_is_allocation(kvant_bin, default_model, TWICE + TWICE_DEV, offload=True)
    weights = os.path.getsize(default_model)
    assert weights > 1.9 * pl["budget"]  # the model is about twice the budget
    assert m["used"] <= pl["budget"]


def test_twice_the_budget_runs_same_tokens(kvant_bin, default_model, tmp_path):
    off = KvantServer(kvant_bin, default_model, *TWICE, *TWICE_DEV, base_args=["-t", THREADS])
    try:
        got = [complete(off, i, n_prompt=30 + 17 * i, max_tokens=12) for i in range(3)]
        assert memory(off)["weights_offload"]["streamed_layers"] > 20
    finally:
        assert off.stop() == 0, off.log_text()
    assert "do not fit the budget" in off.log_text()
    ref = KvantServer(kvant_bin, default_model, *TWICE, base_args=["-t", THREADS])
    try:
        assert not memory(ref)["weights_offload"]["enabled"]
        want = [complete(ref, i, n_prompt=30 + 17 * i, max_tokens=12) for i in range(3)]
    finally:
        assert ref.stop() == 0
    assert got == want
    # the single-sequence commands: bitwise the same logits
    toks = tmp_path / "ids.txt"
    toks.write_text(" ".join(str((i * 7919 + 13) % 40000 + 100) for i in range(40)))

    def logits(*extra):
        out = tmp_path / "o.bin"
        r = subprocess.run([kvant_bin, "logits", "-m", default_model, "-t", THREADS,
                            "--tokens-file", str(toks), "--out", str(out), *extra],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return out.read_bytes(), r.stderr

    a, err = logits("--device-memory", "56MiB")
    assert "do not fit the budget" in err and "streaming layers" in err, err
    b, _ = logits()
    assert a == b
    # --no-offload: the refusal of before
    r = subprocess.run([kvant_bin, "serve", "-m", default_model, "-t", THREADS, "--port", "0",
                        *TWICE, *TWICE_DEV, "--no-offload"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "does not fit" in r.stderr, r.stderr


def test_context_auto(kvant_bin, default_model):
    dev = ["--device-memory", "150MiB", "--max-num-batched-tokens", "256"]
    pl = plan(kvant_bin, default_model, *dev)["plans"][0]["plan"]
    assert pl["ctx_auto"] and 512 < pl["ctx"] < 8192 and not pl["missing_bytes"], pl
    assert pl["fits"] and pl["max_ctx_that_fits"] == pl["ctx"]
    srv = KvantServer(kvant_bin, default_model, *dev, base_args=["-t", THREADS])
    try:
        assert served_ctx(srv) == pl["ctx"]
        text, _ = complete(srv, 0, n_prompt=pl["ctx"] - 8, max_tokens=4)
    finally:
        assert srv.stop() == 0
    assert f"context {pl['ctx']} tokens: the model's 8192 does not fit" in srv.log_text()
    # an explicit -c that cannot fit is refused, naming the largest that does
    r = subprocess.run([kvant_bin, "serve", "-m", default_model, "-t", THREADS, "--port", "0",
                        *dev, "-c", "8192"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and f"add -c {pl['ctx']}" in r.stderr, r.stderr


def test_plan_predicts_tok_s(kvant_bin, default_model, tmp_path):
    """`kvant plan --predict` gives predicted tok/s per tokens-per-pass bucket for a model that
    fits (every layer resident) from the rates it measures and caches; with offload the same
    section carries the offload placement's prediction (weights_offload.predicted)."""
    env = dict(os.environ, KVANT_CACHE_DIR=str(tmp_path / "cache"))

    def run(*args):
        r = subprocess.run([kvant_bin, "plan", "-m", default_model, "-t", THREADS, "--json",
                            *args], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    assert "predicted" not in run(*FITS)  # nothing measured unless asked
    p = run(*FITS, "--predict")["predicted"]
    assert p["placement"] == "resident" and not p["rates_cached"]
    assert [b["tokens_per_pass"] for b in p["buckets"]] == [1, 8, 32, 128, 512]
    assert all(b["tok_s"] > 0 and abs(b["tok_s"] * b["pass_s"] - b["tokens_per_pass"]) <
               1e-3 * b["tokens_per_pass"] for b in p["buckets"])
    assert run(*FITS, "--predict")["predicted"]["rates_cached"]
    o = run(*TWICE, *TWICE_DEV, "--predict")
    assert o["predicted"]["placement"] == "offload"
    assert [b["tok_s"] for b in o["predicted"]["buckets"]] == \
        [b["tok_s"] for b in o["weights_offload"]["predicted"]]
    # the offload placement cannot beat every layer resident with the same rates
    assert o["predicted"]["buckets"][0]["tok_s"] <= p["buckets"][0]["tok_s"] * (1 + 1e-9)
