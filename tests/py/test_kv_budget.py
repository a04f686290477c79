"""A per-request KV budget (kv_budget, the sinks policy; docs/KV.md): attention-sink tokens plus a
recent window, older blocks given back to the pool.

The mask is a function of the position alone: with budget B, block size bs, sinks S (kv_sinks, 4 by
default, rounded up to whole blocks) and the step cap C = clamp(B / 16 rounded down to blocks, 32
rounded up to a block, 256), the token at position p reads positions [0, S) and
[wb(p) * bs, p] with wb(p) = max(S / bs, floor((p - R + 1) / bs)) and R = B - S - C - 2 bs.  The
float64 numpy reference (ref_model.py, RefModel.kv_budget) applies that mask; kvant's reference path
(--exact, f32 K/V) must agree with it
  * on prompt log-probabilities (a 200-token prompt prefilled in steps, blocks given back between),
  * on a greedy generation far past the budget (decode steps give blocks back), where each step's
    chosen log-probability is compared with the reference's greedy step,
and the reference without the mask must disagree (so the mask is what the comparison checks).

Also: the same request gives the same output alone and in a concurrent batch, and when the pool
is too small for all of them (preemption recomputes a budgeted sequence); its footprint
(usage.kv_blocks) stays within the budget and the blocks come back (/metrics); the prefix cache
hits only between requests of the same mask (cached_tokens); bad values are refused with a 400
naming the field.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import make_family as mf
from ref_model import RefModel
from server_util import KvantServer, THREADS

BS = 8
BUDGET = 96
SINKS = 8                          # kv_sinks 4, rounded up to a block of 8
CAP = 32                           # clamp(96 / 16 -> 0 blocks, 32, 256)
RECENT = BUDGET - SINKS - CAP - 2 * BS   # 40


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return mf.make_family(str(tmp_path_factory.mktemp("kv_budget")), "llama3", "F32")


@pytest.fixture(scope="module")
def server(kvant_bin, model):
    srv = KvantServer(kvant_bin, model, "-t", THREADS, "-c", "256", "--block-size", str(BS),
                      "--exact", "--kv-dtype", "f32", "--max-num-batched-tokens", "64",
                      "--kv-blocks", "256", base_args=[])
    yield srv
    srv.stop()


def _ids(n: int, seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 256, size=n)]


def _post(url, **body):
    return httpx.post(url + "/v1/completions", json=body, timeout=300)


def _ok(url, **body):
    r = _post(url, **body)
    assert r.status_code == 200, r.text
    return r.json()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))


def _greedy(ref: RefModel, prompt: list[int], n: int) -> np.ndarray:
    """The reference's greedy continuation of prompt: each step's chosen log-probability."""
    seq, best = list(prompt), []
    for _ in range(n):
        ls = _log_softmax(ref.forward(seq)[-1])
        seq.append(int(ls.argmax()))
        best.append(float(ls.max()))
    return np.array(best)


def _ref(model: str, budget: bool) -> RefModel:
    ref = RefModel(model)
    ref.kv_budget = (SINKS, RECENT, BS) if budget else None
    return ref


def test_prompt_logprobs_match_masked_reference(server, model):
    ids = _ids(200, 1)
    got = _ok(server.url, prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=1,
              kv_budget=BUDGET)
    lp = np.array(got["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)], dtype=np.float64)
    assert got["usage"]["kv_blocks"] * BS <= BUDGET, got["usage"]
    want = {}
    for masked in (True, False):
        ls = _log_softmax(_ref(model, masked).forward(ids))
        want[masked] = ls[np.arange(len(ids) - 1), ids[1:]]
    err = float(np.abs(lp - want[True]).max())
    err_full = float(np.abs(lp - want[False]).max())
    print(f"prompt logprobs: max |kvant - masked ref| {err:.2e}, vs the full-cache ref {err_full:.2e}")
    assert err < 1e-4, err
    assert err_full > 1e-2, err_full  # the mask matters at these positions
    # the positions before any block is skipped agree with the full cache too
    first_cut = RECENT - 1 + SINKS + BS  # wb(p) > S / bs from here on
    assert float(np.abs(lp[:first_cut - 1] - want[False][:first_cut - 1]).max()) < 1e-4


def test_decode_matches_masked_reference(server, model):
    """Greedy generation 150 tokens past a 30-token prompt: every step's chosen log-probability is
    the masked reference's greedy step's (a different path would change them)."""
    prompt, n = _ids(30, 2), 150
    got = _ok(server.url, prompt=prompt, max_tokens=n, temperature=0, logprobs=1, ignore_eos=True,
              kv_budget=BUDGET)
    lp = np.array(got["choices"][0]["logprobs"]["token_logprobs"], dtype=np.float64)
    assert len(lp) == n and got["usage"]["kv_blocks"] * BS <= BUDGET, got["usage"]
    out = {masked: _greedy(_ref(model, masked), prompt, n) for masked in (True, False)}
    err = float(np.abs(lp - out[True]).max())
    err_full = float(np.abs(lp - out[False]).max())
    print(f"greedy logprobs: max |kvant - masked ref| {err:.2e}, vs the full-cache ref {err_full:.2e}")
    assert err < 1e-3, err
    assert err_full > 1e-2, err_full


def _gen(url, k: int, **extra):
    body = dict(prompt=_ids(60 + 7 * k, 10 + k), max_tokens=64, temperature=1.5, seed=k,
                logprobs=2, ignore_eos=True, kv_budget=BUDGET, **extra)
    c = _ok(url, **body)["choices"][0]
    return [c["text"], c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"]]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not on /metrics")


def _tight(testhooks_bin: str, model: str, args: list[str], gen, n: int):
    """gen(url, k) for k < n at once on a server of the test build started with args (then
    stopped): the outputs, preemptions, blocks a KV budget gave back, and /v1/memory's kv.  The
    engine is held (KVANT_TEST_FREEZE_FILE, src/engine/engine.c: it stops before its next step
    while the file exists) until all n requests wait, so they are admitted together and run side
    by side whatever the machine's load (sent unheld, they were served staggered in 2 of 11 runs
    beside a test build, and the small pool then needed no preemption)."""
    freeze = Path(tempfile.mkdtemp(prefix="kvant-freeze-")) / "freeze"
    small = KvantServer(testhooks_bin, model, *args, base_args=[],
                        env={**os.environ, "KVANT_TEST_FREEZE_FILE": str(freeze)})
    try:
        freeze.touch()
        with cf.ThreadPoolExecutor(n) as ex:
            futs = [ex.submit(gen, small.url, k) for k in range(n)]
            deadline = time.time() + 60
            while (waiting := _metric(small.url, "kvant_num_requests_waiting")) < n:
                assert time.time() < deadline, f"{waiting} of {n} requests reached the engine"
                time.sleep(0.02)
            freeze.unlink()
            out = [f.result() for f in futs]
        pre = _metric(small.url, "kvant_num_preemptions_total")
        dropped = _metric(small.url, "kvant_kv_budget_blocks_dropped_total")
        mem = httpx.get(small.url + "/v1/memory", timeout=30).json()["kv"]
    finally:
        shutil.rmtree(freeze.parent, ignore_errors=True)
        small.stop()
    return out, pre, dropped, mem


def test_batch_invariance_and_preemption(testhooks_bin, model, server):
    alone = [_gen(server.url, k) for k in range(6)]
    with cf.ThreadPoolExecutor(6) as ex:
        batch = list(ex.map(lambda k: _gen(server.url, k), range(6)))
    assert batch == alone
    # a pool of 20 blocks: two budgeted sequences past their budget (12 blocks each) do not fit
    args = ["-t", THREADS, "-c", "256", "--block-size", str(BS), "--exact", "--kv-dtype", "f32",
            "--max-num-batched-tokens", "64", "--kv-blocks", "20",
            "--max-itl-ms", "0"]  # schedule by tokens only
    tight, pre, dropped, mem = _tight(testhooks_bin, model, args, lambda url, k: _gen(url, k), 6)
    assert tight == alone
    assert pre > 0 and dropped > 40, (pre, dropped)
    assert mem["used"] == 0, mem


def test_prefix_cache_separates_masks(server, model):
    ids = _ids(150, 3)
    first = _ok(server.url, prompt=ids, max_tokens=4, temperature=0, logprobs=1, kv_budget=BUDGET)
    again = _ok(server.url, prompt=ids, max_tokens=4, temperature=0, logprobs=1, kv_budget=BUDGET)
    other = _ok(server.url, prompt=ids, max_tokens=4, temperature=0, logprobs=1, kv_budget=112)
    full = _ok(server.url, prompt=ids, max_tokens=4, temperature=0, logprobs=1)
    hit = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert hit >= 128, again["usage"]  # the sinks and the window of the hit were cached
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, other["usage"]
    assert full["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, full["usage"]
    assert again["choices"][0]["logprobs"] == first["choices"][0]["logprobs"]
    assert full["usage"]["kv_blocks"] > first["usage"]["kv_blocks"]


@pytest.mark.parametrize("body,param", [
    ({"kv_budget": 50}, "kv_budget"),                    # below sinks + step + window
    ({"kv_budget": -1}, "kv_budget"),
    ({"kv_budget": 100.5}, "kv_budget"),
    ({"kv_budget": "half"}, "kv_budget"),
    ({"kv_policy": "snapkv", "kv_budget": 80}, "kv_budget"),   # no block left to keep
    ({"kv_policy": "snapkv", "kv_budget": 96, "kv_sinks": 4}, "kv_sinks"),
    ({"kv_policy": "snapkv", "kv_budget": 96, "n": 2}, "n"),
    ({"kv_policy": "snapkv"}, "kv_budget"),
    ({"kv_policy": "h2o", "kv_budget": 96, "n": 2}, "n"),
    ({"kv_policy": "h2o", "kv_budget": 96, "kv_sinks": 8}, "kv_sinks"),
    ({"kv_policy": "lru"}, "kv_policy"),
    ({"kv_policy": "full", "kv_budget": 96}, "kv_budget"),
    ({"kv_policy": "sinks"}, "kv_budget"),               # no budget to keep
    ({"kv_sinks": 0, "kv_budget": 96}, "kv_sinks"),
])
def test_refusals(server, body, param):
    r = _post(server.url, prompt=_ids(120, 4), max_tokens=4, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    # and the server goes on serving
    assert _post(server.url, prompt=_ids(20, 5), max_tokens=2).status_code == 200


def test_budget_the_request_fits_changes_nothing(server):
    ids = _ids(40, 6)
    a = _ok(server.url, prompt=ids, max_tokens=20, temperature=0, logprobs=1)
    b = _ok(server.url, prompt=ids, max_tokens=20, temperature=0, logprobs=1, kv_budget=0.5)
    assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"]
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the same blocks


def test_window_model_refused(kvant_bin, tmp_path):
    """gemma2's window layers mask by position in the table the backend reads: a budget there is
    refused (400 naming kv_budget), with and without the window layer group (KV tiers turn it off)."""
    gemma = mf.make_family(str(tmp_path), "gemma2", "F32")
    for extra in ((), ("--kv-host-memory", "64M")):
        srv = KvantServer(kvant_bin, gemma, "-t", THREADS, "-c", "256", "--block-size", str(BS),
                          *extra, base_args=[])
        try:
            r = _post(srv.url, prompt=_ids(150, 7), max_tokens=4, kv_budget=BUDGET)
            assert r.status_code == 400 and r.json()["error"]["param"] == "kv_budget", r.text
            assert _post(srv.url, prompt=_ids(150, 7), max_tokens=4).status_code == 200
        finally:
            srv.stop()


def test_commands_without_the_engine_refuse(kvant_bin, model):
    """`kvant run` and single-stream `kvant bench` have no engine to give blocks back: the option
    is refused, not ignored."""
    import subprocess
    for args in (["run", "-p", "hello", "-n", "2"], ["bench", "-p", "16", "-n", "2", "-r", "1"]):
        for opt in (["--kv-budget", "96"], ["--kv-policy", "snapkv"]):
            p = subprocess.run([kvant_bin, *args, "-m", model, *opt], capture_output=True,
                               text=True, timeout=120)
            assert p.returncode != 0 and opt[0] in p.stderr, (args, p.returncode, p.stderr)
