"""`kvant plan` with several models = what `kvant serve` with the same models allocates
(README "Tuning memory", docs/SERVER.md "Several models").

Two models (the default model and a small synthetic qwen2) served together with both loaded
at start (--pin / --load), at three budgets:

- roomy: both fit with room, so both KV pools grow to their maximum (--max-num-seqs requests
  of the context each);
- tight: both fit only about at their shares: the first pool grows into the free budget, is
  shrunk back when the second model loads, and both grow into what is left;
- one fits: the budget holds either model but not both: loading the second evicts the first.

For each, the plan's JSON (budget, each model's bytes by category, KV pool blocks at start,
its least and most, context, footprint, used bytes) equals /v1/models of the server, byte for
byte.  Independent checks: the roomy pools hold max_num_seqs * ceil(ctx / block) blocks and
their shares 2 * ceil(ctx / block) less the block held for the attention scratch; the tight
one leaves less free than one block per pool with room; and a plan for another budget does
not match the server (the comparison can fail).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import time

import httpx
import pytest

from make_synthetic import make_model
from server_util import KvantServer, free_port

THREADS = os.environ.get("KVANT_THREADS", "2")
CTX, SEQS, BLOCK = 256, 4, 16
COMMON = ["-t", THREADS, "-c", str(CTX), "--max-num-seqs", str(SEQS)]
ROOMY = 400 << 20
UTIL = 0.9  # the default --gpu-memory-utilization: budget = device memory x 0.9


@pytest.fixture(scope="module")
def models(default_model, synthetic_dir) -> list[str]:
    return [f"a={default_model}", f"b={make_model(synthetic_dir, 'qwen2-Q8_0')}"]


def model_args(models) -> list[str]:
    return [x for m in models for x in ("-m", m)]


def plan(kvant_bin, models, *args, ok=True) -> dict:
    r = subprocess.run([kvant_bin, "plan", *model_args(models), *COMMON, "--json", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == (0 if ok else 1), r.stderr + r.stdout
    return json.loads(r.stdout)


def serve(kvant_bin, models, *args) -> tuple[dict, str]:
    """/v1/models of a server started with both models, once its start-up is done."""
    srv = KvantServer(kvant_bin, models[0], "-m", models[1], *COMMON, *args, base_args=[])
    try:
        deadline = time.time() + 120
        while "ready on" not in srv.log_text():
            assert time.time() < deadline, srv.log_text()
            time.sleep(0.1)
        r = httpx.get(srv.url + "/v1/models", timeout=30)
        assert r.status_code == 200, r.text
        return r.json(), srv.log_text()
    finally:
        assert srv.stop() == 0, srv.log_text()


def compare(p: dict, got: dict, budget=True) -> dict:
    """Asserts the plan is the allocation; returns {name: served model}."""
    assert not budget or got["memory"]["budget_bytes"] == p["budget"]
    served = {m["id"]: m for m in got["data"]}
    assert sorted(served) == sorted(m["name"] for m in p["models"])
    for pm in p["models"]:
        s, st = served[pm["name"]], pm["at_start"]
        assert pm["ok"], pm
        assert s["need_bytes"] == pm["need_bytes"], (s, pm)
        assert s["kv_share_bytes"] == pm["kv_share_bytes"]
        assert s["max_model_len"] == pm["ctx"]
        assert s["resident_by_category"] == st["resident_by_category"], (pm["name"], s, st)
        assert s["resident_bytes"] == st["resident_bytes"]
        assert s["state"] == ("loaded" if st["loaded"] else "unloaded"), (s, st)
        assert s["evictions"] == (1 if st["evicted"] else 0)
        assert s["kv_blocks_total"] == st["kv_blocks"], (pm["name"], s, st)
        assert s["kv_blocks_min"] == st["kv_blocks_min"]
        assert s["kv_blocks_max"] == st["kv_blocks_max"]
        assert s["kv_pool_bytes"] == st["kv_bytes"]
    assert got["memory"]["used_bytes"] == p["start"]["used_bytes"]
    assert got["memory"]["available_bytes"] == p["start"]["free_bytes"]
    return served


def dev_for(budget: int) -> str:
    """A --device-memory whose budget (x UTIL, rounded down) is budget or a few bytes more."""
    return str(math.ceil(budget / UTIL))


def test_plan_models_roomy(kvant_bin, models):
    args = ["--device-memory", str(ROOMY), "--pin", "a", "--load", "b"]
    p = plan(kvant_bin, models, *args)
    assert p["elastic"] and p["start"]["ok"] and p["start"]["order"] == ["a", "b"]
    got, _ = serve(kvant_bin, models, *args)
    compare(p, got)
    ctx_blocks = -(-CTX // BLOCK)
    for m in p["models"]:
        st = m["at_start"]
        assert m["fits"] and st["loaded"]
        assert m["kv_share_blocks"] == 2 * ctx_blocks  # REG_DEFAULT_KV_REQS requests
        assert m["need_bytes"] == (m["weights_bytes"] + m["activation_bytes"] +
                                   m["act_q8_bytes"] + m["kv_share_bytes"])
        # the share less the blocks held for the backend's attention scratch (the fewest that
        # hold it), grown to the most
        held = -(-m["scratch_bytes"] // m["kv_block_bytes"])
        assert held >= 1 and st["kv_blocks_min"] == 2 * ctx_blocks - held
        assert st["kv_blocks"] == st["kv_blocks_max"] == SEQS * ctx_blocks
        cat = st["resident_by_category"]
        assert cat["weights"] == m["weights_bytes"]
        assert cat["kv"] == st["kv_blocks"] * m["kv_block_bytes"]
        assert 0 < cat["workspace"] - m["act_q8_bytes"] <= m["scratch_bytes"]
    assert p["start"]["used_bytes"] == sum(
        m["at_start"]["resident_bytes"] for m in p["models"])
    # the comparison can fail: another budget's plan is not this server
    other = plan(kvant_bin, models, "--device-memory", dev_for(
        sum(m["need_bytes"] for m in p["models"]) + (1 << 20)), "--pin", "a", "--load", "b")
    with pytest.raises(AssertionError, match="kv_blocks|resident"):
        compare(other, got, budget=False)


def test_plan_models_tight(kvant_bin, models):
    roomy = plan(kvant_bin, models, "--device-memory", str(ROOMY))
    need = {m["name"]: m for m in roomy["models"]}
    a, b = need["a"], need["b"]
    # room for both footprints and 3 of a's blocks: a grows into it, gives it back to load b
    budget = a["need_bytes"] + b["need_bytes"] + 3 * a["kv_block_bytes"]
    args = ["--device-memory", dev_for(budget), "--pin", "a", "--load", "b"]
    p = plan(kvant_bin, models, *args)
    assert p["budget"] - budget < 8 and p["start"]["ok"], p
    got, log = serve(kvant_bin, models, *args)
    served = compare(p, got)
    assert "a shrinks" in log and "to load b" in log, log  # the reclaim path was taken
    assert served["a"]["kv_shrinks"] == 1
    # by hand, from the rules in docs/SERVER.md and the served bytes: a loads with its share
    # less the held blocks (the fewest that hold its scratch), grows into the free budget, gives back what b needs, b loads the
    # same way, then each pool below its maximum grows by an equal part of what is left
    bud, sa, sb = p["budget"], served["a"], served["b"]
    scr = {k: v["resident_by_category"]["workspace"] - need[k]["act_q8_bytes"]
           for k, v in served.items()}
    bba, bbb, mx = a["kv_block_bytes"], b["kv_block_bytes"], SEQS * -(-CTX // BLOCK)
    held_a, held_b = -(-a["scratch_bytes"] // bba), -(-b["scratch_bytes"] // bbb)
    used = a["need_bytes"] - held_a * bba + scr["a"]
    blocks_a = a["kv_share_blocks"] - held_a
    add = min((bud - used) // bba, mx - blocks_a)
    blocks_a, used = blocks_a + add, used + add * bba
    if b["need_bytes"] > bud - used:
        cut = min(-(-(b["need_bytes"] - (bud - used)) // bba), add)
        blocks_a, used = blocks_a - cut, used - cut * bba
    used += b["need_bytes"] - held_b * bbb + scr["b"]
    blocks_b = b["kv_share_blocks"] - held_b
    part = (bud - used) // ((blocks_a < mx) + (blocks_b < mx))
    blocks_a += min(part // bba, mx - blocks_a)
    blocks_b += min(part // bbb, mx - blocks_b)
    assert (sa["kv_blocks_total"], sb["kv_blocks_total"]) == (blocks_a, blocks_b), (sa, sb)
    assert a["kv_share_blocks"] - held_a < blocks_a < mx and blocks_b < mx  # neither at its most
    assert p["start"]["used_bytes"] + p["start"]["free_bytes"] == bud


def test_plan_models_one_fits(kvant_bin, models):
    roomy = plan(kvant_bin, models, "--device-memory", str(ROOMY))
    need = {m["name"]: m["need_bytes"] for m in roomy["models"]}
    budget = need["a"] + need["b"] // 2  # either alone, not both
    args = ["--device-memory", dev_for(budget), "--load", "a", "--load", "b"]
    p = plan(kvant_bin, models, *args)
    st = {m["name"]: m["at_start"] for m in p["models"]}
    assert st["a"]["evicted"] and not st["a"]["loaded"] and st["b"]["loaded"], p
    assert all(m["fits"] for m in p["models"])
    got, log = serve(kvant_bin, models, *args)
    compare(p, got)
    assert "evicting a" in log, log
    # pinned, a cannot make room: plan and serve refuse the start alike
    refused = plan(kvant_bin, models, "--device-memory", dev_for(budget), "--pin", "a", "--load",
                   "b", ok=False)
    assert not refused["start"]["ok"] and "next to the pinned models" in refused["start"]["error"]
    r = subprocess.run([kvant_bin, "serve", *model_args(models), *COMMON, "--port", str(free_port()),
                        "--device-memory", dev_for(budget), "--pin", "a", "--load", "b"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "next to the pinned models" in r.stderr, r.stderr


def test_plan_models_text_and_single(kvant_bin, models, default_model):
    r = subprocess.run([kvant_bin, "plan", *model_args(models), *COMMON, "--device-memory",
                        str(ROOMY), "--pin", "a", "--load", "b"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "2 models share a budget of 360.00 MiB" in r.stdout, r.stdout
    assert "at start" in r.stdout and "pinned" in r.stdout and " free" in r.stdout
    # one -m: today's single-model plan
    one = subprocess.run([kvant_bin, "plan", "-m", default_model, "--json", *COMMON],
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0 and "plans" in json.loads(one.stdout)
    bad = subprocess.run([kvant_bin, "plan", *model_args(models), "--pin", "zz"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--pin zz: no such model" in bad.stderr, bad.stderr
