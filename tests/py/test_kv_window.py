"""Sliding-window layers keep only their window in the KV pool (docs/ARCHITECTURE.md, "Sliding-window
layer groups").

A model with both window and global layers (gemma2: every other layer slides; gemma3: 5 of 6) keeps
the window layers' K/V in a second pool, and each sequence gives back the window blocks that no later
position reads.  The reference is the same server with `--kv-window-keep` (the second pool as large as
the first, no block given back): every output must be bitwise equal, as JSON carries it (tokens, and
log-probabilities printed with 17 significant digits), for
  * one sequence whose generation is much longer than the window (8 tokens, blocks of 8),
  * a batch of concurrent requests, one with n = 2 (forked sequences share their window blocks),
  * a prefix-cache hit longer than the window (the second request's cached_tokens > W),
  * prompt log-probabilities over a 200-token prompt prefilled 16 tokens a step (blocks are given
    back between the chunks).
Sampling is seeded at temperature 2 with a frequency penalty, so the random-weight models do not
settle into one repeated token (greedy does) and every position's distribution differs.

The given-back blocks really return: with a window pool of 4 blocks, a 220-token sequence (28 global
blocks) completes, and `/v1/memory` shows its window blocks bounded and the pool whole afterwards.

The Gemma-3-shaped 32k measurement (make_family shape "long": 5 window + 1 global layers, window
1024, context 32768, n_embd 64, one KV head of 32): a 32668-token prompt, then /v1/memory while it
decodes.  The request's kv_bytes (measured from its block tables) must be within 1% of
(global layers x 32768 + window layers x 1024) x row bytes, and `kvant plan` must say the same.
Measured when written: 4,853,760 bytes at 32,717 stored tokens against the formula's 4,849,664
(+0.08%); the plan's kv_seq_bytes 4,859,904 (+0.21%: 65 window blocks of 16 for a 1024 window).
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import random
import subprocess
import time

import httpx
import pytest

import make_family as mf
from server_util import KvantServer, THREADS

BS = 8          # KV block size for the tiny models (window 8)
W_TINY = 8
TEXT = ("the cat is on the mat and the dog is here too, a bird sings in the old tree by the river "
        "while seven small boats drift past the quiet mill at noon")


@pytest.fixture(scope="module")
def fam_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("kv_window"))


def _server(kvant_bin, model, *args):
    return KvantServer(kvant_bin, model, "-t", THREADS, "-c", "256", "--block-size", str(BS),
                       "--max-num-batched-tokens", "16", "--max-num-seqs", "4", *args, base_args=[])


def _complete(url, **body):
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _sampled(url, prompt, seed, n_tok, **extra):
    return _complete(url, prompt=prompt, max_tokens=n_tok, temperature=2.0, seed=seed,
                     frequency_penalty=2.0, logprobs=3, **extra)


def _outputs(choice):
    lp = choice["logprobs"]
    return [choice["text"], lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]]


def _scenario(url):
    """Every output of the four cases, as JSON values, and the prefix hit's cached tokens."""
    out = {"single": _outputs(_sampled(url, TEXT, 11, 150)["choices"][0])}
    jobs = [(TEXT[:40 + 9 * k], 100 + k, 60, {"n": 2} if k == 3 else {}) for k in range(4)]
    with cf.ThreadPoolExecutor(4) as ex:
        res = list(ex.map(lambda j: _sampled(url, j[0], j[1], j[2], **j[3]), jobs))
    out["batch"] = [[_outputs(c) for c in r["choices"]] for r in res]
    long_prompt = TEXT + " " + TEXT
    first = _sampled(url, long_prompt, 5, 20)
    again = _sampled(url, long_prompt + " and then", 6, 40)
    out["prefix"] = [_outputs(first["choices"][0]), _outputs(again["choices"][0])]
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    echo = _complete(url, prompt=TEXT * 2, max_tokens=1, temperature=0, echo=True, logprobs=2)
    out["prompt_logprobs"] = echo["choices"][0]["logprobs"]["token_logprobs"]
    return out, cached


def _memory(url):
    return httpx.get(url + "/v1/memory", timeout=30).json()


@pytest.mark.parametrize("family", ["gemma3", "gemma2"])
def test_window_free_bitwise(family, fam_dir, kvant_bin):
    model = mf.make_family(fam_dir, family, "F32")
    results = {}
    for mode, args in (("free", ()), ("keep", ("--kv-window-keep",))):
        srv = _server(kvant_bin, model, "--kv-blocks", "160", *args)
        try:
            results[mode] = _scenario(srv.url)
            mem = _memory(srv.url)["kv"]
        finally:
            srv.stop()
        w = mem["window"]
        assert w["window"] == W_TINY and w["used"] == 0 and w["free"] + w["cached"] == w["blocks"]
        if mode == "free":
            assert w["dropped_total"] > 100, w  # the 150-token sequence alone gives back ~18
        else:
            assert w["dropped_total"] == 0, w
    (free, cached_free), (keep, cached_keep) = results["free"], results["keep"]
    assert cached_free > W_TINY and cached_free == cached_keep, (cached_free, cached_keep)
    assert len(free["prompt_logprobs"]) > 40
    for case in free:
        assert json.dumps(free[case]) == json.dumps(keep[case]), f"{family} {case}: outputs differ"


def test_window_blocks_return_to_pool(fam_dir, kvant_bin):
    """A window pool of 4 blocks serves a 220-token sequence (28 global blocks): only because the
    blocks behind the window come back.  While it decodes its window blocks stay <= 3 (W 8 in blocks
    of 8: ceil(8/8) + 1; the step's block is reserved on top of what the snapshot shows at most once);
    afterwards every block of both pools is free or cached."""
    model = mf.make_family(fam_dir, "gemma3", "F32")
    srv = _server(kvant_bin, model, "--kv-blocks", "64", "--kv-window-blocks", "4")
    try:
        before = _memory(srv.url)["kv"]
        assert before["window"]["blocks"] == 4 and before["window"]["free"] == 4
        snaps = []
        body = {"prompt": TEXT[:60], "max_tokens": 200, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=300) as r:
            n = 0
            for line in r.iter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    n += 1
                    if n in (20, 120):
                        snaps.append(_memory(srv.url))
        after = _memory(srv.url)["kv"]
    finally:
        srv.stop()
    reqs = [q for s in snaps for q in s["requests"]]
    assert reqs, "no snapshot caught the request in flight"
    for q in reqs:
        assert 1 <= q["blocks_window"] <= 3, q
        assert q["kv_bytes"] == q["kv_bytes_global"] + q["kv_bytes_window"]
    assert max(q["blocks_own"] + q["blocks_shared"] for q in reqs) > 4  # longer than the pool
    assert after["window"]["used"] == 0 and after["used"] == 0
    assert after["window"]["free"] + after["window"]["cached"] == 4
    assert after["free"] + after["cached"] == after["blocks"]
    assert after["window"]["dropped_total"] >= 220 // BS - 3


def test_gemma3_32k_window_memory(fam_dir, kvant_bin, run_kvant, record_result):
    model = mf.make_family(fam_dir, "gemma3", "F32", "long")
    sh = mf.LONG["gemma3"]
    n_win = sum(1 for il in range(sh.n_layer) if il % 6 < 5)
    n_glob = sh.n_layer - n_win
    row = 2 * sh.n_head_kv * sh.head_dim * 2              # K and V rows in f16, one layer, one token
    formula = (n_glob * 32768 + n_win * sh.window) * row
    dev = ["--device-memory", "512M"]
    plan = json.loads(run_kvant(["plan", "-m", model, "-c", "32768", "-t", THREADS, *dev,
                                 "--json"]).stdout)["plans"][0]["plan"]
    assert plan["kv_bytes_per_token"] == n_glob * row
    assert plan["kv_window"]["bytes_per_token"] == n_win * row
    assert abs(plan["kv_seq_bytes"] / formula - 1) < 0.01, (plan["kv_seq_bytes"], formula)
    srv = KvantServer(kvant_bin, model, "-t", THREADS, "-c", "32768", *dev, base_args=[])
    try:
        rng = random.Random(1)
        ids = [rng.randrange(3, sh.n_vocab - 4) for _ in range(32768 - 100)]
        body = {"prompt": ids, "max_tokens": 90, "temperature": 0, "stream": True, "ignore_eos": True}
        mem = None
        t0 = time.time()
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=900) as r:
            n = 0
            for line in r.iter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    n += 1
                    if n == 3:
                        mem = _memory(srv.url)
        seconds = time.time() - t0
    finally:
        srv.stop()
    assert mem and len(mem["requests"]) == 1, mem and mem["requests"]
    q, kv = mem["requests"][0], mem["kv"]
    ratio = q["kv_bytes"] / formula
    record_result("kv_window_32k", {"kv_bytes": q["kv_bytes"], "kv_tokens": q["kv_tokens"],
                                    "formula": formula, "ratio": ratio,
                                    "plan_kv_seq_bytes": plan["kv_seq_bytes"], "seconds": seconds})
    assert abs(ratio - 1) < 0.01, (q, formula)
    assert q["kv_tokens"] > 32768 - 100
    assert q["kv_bytes_window"] == q["blocks_window"] * kv["window"]["block_bytes"]
    assert q["blocks_window"] <= sh.window // 16 + 1
    # the pools the engine made are the plan's (the global one less the fewest blocks that hold
    # the backend's attention scratch, which is workspace)
    assert kv["window"]["blocks"] == plan["kv_window"]["blocks"]
    held = plan["kv_pool_blocks"] - kv["global"]["blocks"]
    ws = mem["categories"]["workspace"]["current"]
    assert 0 <= held and (held - 1) * kv["global"]["block_bytes"] < ws, (held, ws)
    assert kv["global"]["block_bytes"] == 16 * n_glob * row
    assert kv["window"]["block_bytes"] == 16 * n_win * row
    # the planner's concurrency at 32k is what both pools allow
    conc = plan["max_concurrency"]["32768"]
    by_global = plan["kv_pool_tokens"] / 32768
    by_window = (plan["kv_window"]["blocks"] - plan["kv_window"]["margin_blocks"]) / (sh.window // 16 + 1)
    assert conc == pytest.approx(min(by_global, by_window))


def test_window_prefix_hit_after_eviction(fam_dir, kvant_bin):
    """A window pool of 8 blocks cannot keep a 112-token prompt's 14 window blocks: its early ones
    are evicted while the prompt is still being prefilled.  The prompt again (and more) is still a
    prefix hit of all 14 blocks, because only the blocks the hit's window reads (the last one or
    two) must be cached (a match from block 0 would find nothing); its outputs equal the reference
    server's (window blocks kept), which served the hit from a full chain."""
    model = mf.make_family(fam_dir, "gemma3", "F32")
    prompt = TEXT + " " + TEXT[:10]
    got = {}
    for mode, args in (("free", ("--kv-window-blocks", "8")), ("keep", ("--kv-window-keep",))):
        srv = _server(kvant_bin, model, "--kv-blocks", "160", *args)
        try:
            first = _sampled(srv.url, prompt, 3, 1)
            again = _sampled(srv.url, prompt + " and more", 4, 30)
            mem = _memory(srv.url)["kv"]
        finally:
            srv.stop()
        got[mode] = (_outputs(first["choices"][0]), _outputs(again["choices"][0]),
                     again["usage"]["prompt_tokens_details"]["cached_tokens"],
                     first["usage"]["prompt_tokens"])
        if mode == "free":
            assert mem["window"]["blocks"] == 8 and mem["window"]["dropped_total"] >= 15
    n_prompt = got["free"][3]
    assert n_prompt > 100
    hit = n_prompt // BS * BS  # the full blocks the first request stored
    assert got["free"][2] == hit and got["keep"][2] == hit, (got["free"][2], got["keep"][2], hit)
    assert json.dumps(got["free"][:2]) == json.dumps(got["keep"][:2])
