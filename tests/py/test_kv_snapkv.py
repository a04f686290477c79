"""A per-request KV budget under the snapkv and h2o policies (docs/KV.md).  snapkv: the prompt is computed with the
whole cache; its last 32 tokens' attention probabilities, per layer and KV head, summed over the
window's queries and the head's query heads and max-pooled (kernel 7), choose which positions
before the decode window each (layer, KV head) keeps; the kept rows are copied into fresh blocks
and everything else behind the window goes back to the pool.

With budget B, block size bs and step cap C (as for sinks), the window is R = max(B / 8 rounded
down to blocks, 32 rounded up to a block + a block) and the kept rows K = (B - C - 2 bs - R)
rounded down to blocks.  The float64 numpy reference (ref_model.py, RefModel.snapkv) selects the
same way from its own probabilities and masks each head's later rows to its kept positions plus
the window; kvant's reference path (--exact, f32 K/V) must agree with it
  * on the prompt's log-probabilities (the whole cache: the unmasked reference),
  * on a greedy generation past the prompt, every step's chosen log-probability,
and the reference with the sinks mask of the same budget, and the full cache, must disagree.

h2o (RefModel.h2o runs kvant's algorithm row by row in float64): every prompt token's probabilities
choose the kept rows, every decode step's add to them, each block leaving the window is merged
into them; compared the same way after a prompt compacted at its end and after a short one whose
first merge comes while decoding.

Also: alone, in a batch, and under preemption (recomputed: the same selection) the same output;
usage.kv_blocks within the budget after the prompt; prefix-cache hits between snapkv and full
requests (the prompt's blocks are whole-cache ones); the selection's margin is asserted, so a
near-tie cannot make the comparison pass or fail by chance.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

import make_family as mf
from ref_model import RefModel
from server_util import KvantServer, THREADS
from test_kv_budget import _greedy, _ids, _log_softmax, _metric, _ok, _tight

BS = 8
BUDGET = 160
CAP = 32                                   # clamp(160 / 16 -> 1 block, 32, 256)
RECENT = 40                                # max(160 / 8 -> 16, 32 + 8)
KEEP = (BUDGET - CAP - 2 * BS - RECENT) // BS * BS   # 72
OBS, POOL = 32, 7
N_PROMPT = 200
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return mf.make_family(str(tmp_path_factory.mktemp("snapkv")), "llama3", "F32")


def _server_args(blocks: int) -> list[str]:
    return ["-t", THREADS, "-c", "256", "--block-size", str(BS), "--exact", "--kv-dtype", "f32",
            "--max-num-batched-tokens", "64", "--kv-blocks", str(blocks),
            "--max-itl-ms", "0"]  # schedule by tokens only


def _server(kvant_bin, model, blocks: int) -> KvantServer:
    return KvantServer(kvant_bin, model, *_server_args(blocks), base_args=[])


@pytest.fixture(scope="module")
def server(kvant_bin, model):
    srv = _server(kvant_bin, model, 256)
    yield srv
    srv.stop()


def _ref(model: str, mode: str, n_prompt: int) -> RefModel:
    ref = RefModel(model)
    if mode == "snapkv":
        wb = (n_prompt - RECENT + 1) // BS
        ref.snapkv = dict(prompt=n_prompt, obs_from=n_prompt - OBS, n=wb * BS, keep=KEEP,
                          recent=RECENT, bs=BS, pool=POOL)
    elif mode == "sinks":   # the sinks policy's mask at the same budget (4 sinks: a block)
        ref.kv_budget = (BS, BUDGET - BS - CAP - 2 * BS, BS)
    return ref


def _no_near_tie(ref: RefModel) -> None:
    """Every selection the reference made had a margin kvant's float32 scores cannot flip (a
    tie, broken by position alike, or a relative gap above 1e-4)."""
    gaps = [g for g in ref.snap_gaps if g > 0]
    assert not gaps or min(gaps) > 1e-4, min(gaps)


def test_decode_matches_reference(server, model):
    prompt, n = _ids(N_PROMPT, 21), 40
    dropped0 = _metric(server.url, "kvant_kv_budget_blocks_dropped_total")
    got = _ok(server.url, prompt=prompt, max_tokens=n, temperature=0, logprobs=1, echo=True,
              ignore_eos=True, kv_budget=BUDGET, kv_policy="snapkv")
    lp_all = got["choices"][0]["logprobs"]["token_logprobs"]
    plp, lp = np.array(lp_all[1:N_PROMPT], dtype=np.float64), np.array(lp_all[N_PROMPT:], dtype=np.float64)
    assert len(lp) == n
    # usage is the footprint at its largest: the whole prompt
    assert got["usage"]["kv_blocks"] == -(-N_PROMPT // BS), got["usage"]
    out = {}
    for mode in ("snapkv", "sinks", "full"):
        ref = _ref(model, mode, N_PROMPT)
        out[mode] = _greedy(ref, prompt, n)
        if mode == "snapkv":
            _no_near_tie(ref)
        if mode == "full":
            ls = _log_softmax(ref.forward(prompt))
            want = ls[np.arange(N_PROMPT - 1), prompt[1:]]
            assert float(np.abs(plp - want).max()) < 1e-4   # the prompt sees the whole cache
    # behind the window (block 20 on at position 200) all but the 9 kept blocks went back
    assert _metric(server.url, "kvant_kv_budget_blocks_dropped_total") - dropped0 >= 20 - KEEP // BS
    err = {m: float(np.abs(lp - out[m]).max()) for m in out}
    print("greedy logprobs, max |kvant snapkv - ref|:", {m: f"{v:.2e}" for m, v in err.items()})
    assert err["snapkv"] < 1e-3, err
    assert err["sinks"] > 1e-2 and err["full"] > 1e-2, err


def _gen(url, k: int, policy: str = "snapkv"):
    body = dict(prompt=_ids(150 + 9 * k, 30 + k), max_tokens=48, temperature=1.5, seed=k,
                logprobs=2, ignore_eos=True, kv_budget=BUDGET, kv_policy=policy)
    c = _ok(url, **body)["choices"][0]
    return [c["text"], c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"]]


@pytest.mark.parametrize("policy", ["snapkv", "h2o"])
def test_batch_invariance_and_preemption(testhooks_bin, model, server, policy):
    alone = [_gen(server.url, k, policy) for k in range(5)]
    with cf.ThreadPoolExecutor(5) as ex:
        batch = list(ex.map(lambda k: _gen(server.url, k, policy), range(5)))
    assert batch == alone
    # 64 blocks: five prompts of 19-28 blocks do not fit at once; preempted ones recompute
    tight, pre, dropped, mem = _tight(testhooks_bin, model, _server_args(64),
                                      lambda url, k: _gen(url, k, policy), 5)
    assert tight == alone
    assert pre > 0 and dropped > 20, (pre, dropped)
    assert mem["used"] == 0, mem


def test_prefix_cache_shared_with_full_requests(server):
    ids = _ids(180, 41)
    full = _ok(server.url, prompt=ids, max_tokens=4, temperature=0, logprobs=1)
    snap = _ok(server.url, prompt=ids, max_tokens=4, temperature=0, logprobs=1, kv_budget=BUDGET,
               kv_policy="snapkv")
    again = _ok(server.url, prompt=ids, max_tokens=4, temperature=0, logprobs=1, kv_budget=BUDGET,
                kv_policy="snapkv")
    # the hit stops before the observation window (its queries are scored)
    for r in (snap, again):
        hit = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert 180 - OBS - BS < hit <= 180 - OBS, r["usage"]
    assert again["choices"][0]["logprobs"] == snap["choices"][0]["logprobs"]
    # the first token comes from the whole prompt: the same as the full cache's
    assert snap["choices"][0]["logprobs"]["tokens"][0] == full["choices"][0]["logprobs"]["tokens"][0]


def test_footprint_while_decoding(kvant_bin):
    """/v1/memory while a request decodes on the default model: its blocks within the budget once
    compacted (usage reports the prompt's, its largest), against the whole prompt's without."""
    srv = KvantServer(kvant_bin, str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"), "-t", THREADS,
                      "-c", "2048", base_args=[])
    try:
        held = {}
        for pol in ("snapkv", "full"):
            body = dict(prompt=_ids(1000, 51), max_tokens=64, temperature=0, ignore_eos=True,
                        stream=True, stream_options={"include_usage": True})
            if pol == "snapkv":
                body.update(kv_budget=512, kv_policy="snapkv")
            seen, usage = [], None
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=300) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {") and len(seen) < 2:
                        reqs = httpx.get(srv.url + "/v1/memory", timeout=30).json()["requests"]
                        seen += [q["blocks_own"] + q["blocks_shared"] for q in reqs]
                    if line.startswith("data: {") and '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage") or usage
            held[pol] = (max(seen), usage["kv_blocks"])
    finally:
        srv.stop()
    assert held["snapkv"][0] * 16 <= 512, held
    assert held["full"][0] * 16 >= 1000 and held["snapkv"][1] == 1000 // 16 + 1, held


def test_server_default_policy(kvant_bin, model, server):
    """--kv-budget with --kv-policy snapkv: a request naming neither runs as one naming both; one
    with n 2 (or kv_sinks) keeps the sinks policy, as it would name it."""
    ids = _ids(190, 61)
    want = _ok(server.url, prompt=ids, max_tokens=30, temperature=0, logprobs=1, ignore_eos=True,
               kv_budget=BUDGET, kv_policy="snapkv")
    sinks = _ok(server.url, prompt=ids, max_tokens=30, temperature=1.0, seed=3, n=2, logprobs=1,
                ignore_eos=True, kv_budget=BUDGET, kv_policy="sinks")
    srv = KvantServer(kvant_bin, model, "-t", THREADS, "-c", "256", "--block-size", str(BS),
                      "--exact", "--kv-dtype", "f32", "--max-num-batched-tokens", "64",
                      "--kv-blocks", "256", "--kv-budget", str(BUDGET), "--kv-policy", "snapkv",
                      base_args=[])
    try:
        got = _ok(srv.url, prompt=ids, max_tokens=30, temperature=0, logprobs=1, ignore_eos=True)
        two = _ok(srv.url, prompt=ids, max_tokens=30, temperature=1.0, seed=3, n=2, logprobs=1,
                  ignore_eos=True)
    finally:
        srv.stop()
    assert got["choices"][0]["logprobs"] == want["choices"][0]["logprobs"]
    assert [c["logprobs"] for c in two["choices"]] == [c["logprobs"] for c in sinks["choices"]]


def _h2o_ref(model: str, n_prompt: int) -> RefModel:
    ref = RefModel(model)
    ref.h2o = dict(prompt=n_prompt, keep=KEEP, recent=RECENT, bs=BS, sink_blocks=KEEP // BS)
    return ref


@pytest.mark.parametrize("n_prompt", [N_PROMPT, 60])
def test_h2o_decode_matches_reference(server, model, n_prompt):
    """h2o: the prompt's every token's attention chooses the kept rows, every decode step's
    attention adds to them, and each block leaving the window is merged into them.  A 200-token
    prompt compacts at its end; a 60-token one fits the kept rows and the window, and its first
    merge comes while decoding (its sink blocks become its own copies then)."""
    prompt, n = _ids(n_prompt, 22), 40 if n_prompt == N_PROMPT else 110
    got = _ok(server.url, prompt=prompt, max_tokens=n, temperature=0, logprobs=1, ignore_eos=True,
              kv_budget=BUDGET, kv_policy="h2o")
    lp = np.array(got["choices"][0]["logprobs"]["token_logprobs"], dtype=np.float64)
    assert len(lp) == n
    out = {}
    for mode in ("h2o", "sinks"):
        ref = _h2o_ref(model, n_prompt) if mode == "h2o" else _ref(model, "sinks", n_prompt)
        out[mode] = _greedy(ref, prompt, n)
        if mode == "h2o":
            _no_near_tie(ref)
    err = {m: float(np.abs(lp - out[m]).max()) for m in out}
    print(f"h2o prompt {n_prompt}, max |kvant - ref|:", {m: f"{v:.2e}" for m, v in err.items()})
    assert err["h2o"] < 1e-3, err
    assert err["sinks"] > 1e-2, err
