"""`kvant plan --weights-memory` on a mixture of experts (cli/cli_xplan.h): the expert cache's
slots as serve takes them; the decode hit rate of its calibration decode within the budget, and
at other budgets the hit rate predicted by replaying that decode's expert trace, each against
the hit rate `kvant bench` measures on other tokens (its own random stream, a different seed)
with that budget.  Tokens/s is not checked here (timing); bench/moe_plan.py measures it on
OLMoE's shape."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

import make_family as mf

THREADS = "2"


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory) -> str:
    return mf.make_family(str(tmp_path_factory.mktemp("moeplan")), "olmoe", "Q4_0")


def _run(cmd, tmp_path):
    env = dict(os.environ, KVANT_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _plan(kvant_bin, model, budget, tmp_path, *extra):
    r = _run([kvant_bin, "plan", "-m", model, "-t", THREADS, "--weights-memory", budget,
              "--json", *extra], tmp_path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _bench_hit_rate(kvant_bin, model, budget, slots, tmp_path):
    r = _run([kvant_bin, "bench", "-m", model, "-t", THREADS, "-p", "0", "-n", "200", "-r", "1",
              "--weights-memory", str(budget), "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    assert b["expert_slots"] == slots
    return b["tg_expert_hits"] / (b["tg_expert_hits"] + b["tg_expert_misses"])


def test_hit_rates_near_measured(kvant_bin, olmoe, tmp_path):
    budget = "2M"   # 7 of 16 experts
    plan = _plan(kvant_bin, olmoe, budget, tmp_path)
    off = plan["weights_offload"]
    assert off["mode"] == "experts" and off["experts"] == 16 and off["slots"] == 7
    assert off["calibration"]["tokens"] == 256 and off["calibration"]["counted_tokens"] == 128
    assert off["calibration"]["source"] == "random"
    # the stored row plans the resident bytes: dense weights plus the slots
    assert off["resident_bytes"] == off["dense_bytes"] + off["slots"] * off["slot_bytes"]
    assert off["resident_bytes"] <= 2 * 2**20
    assert plan["plans"][0]["plan"]["weights_bytes"] == off["resident_bytes"]
    resident = off["resident"]
    assert len(resident) == 2 and sum(map(len, resident)) <= off["slots"]
    dec = off["decode"]
    assert dec["slots"] == 7 and dec["expert_reads_per_token"] > 0 and dec["tok_s"] > 0
    # other budgets: a tenth of the experts and up (those holding a token's 2), each its
    # weights memory; fewer reads and more tok/s with more slots
    rows = off["predicted"]
    assert [r["slots"] for r in rows] == [3, 4, 6, 8, 9, 11, 12, 14, 16]
    assert all(r["weights_memory"] == off["dense_bytes"] + r["slots"] * off["slot_bytes"]
               for r in rows)
    assert all(a["expert_reads_per_token"] >= b["expert_reads_per_token"] and
               a["tok_s"] <= b["tok_s"] for a, b in zip(rows, rows[1:]))
    # measured with other tokens: at the planned budget and at two predicted ones
    for row in (dec, rows[2], rows[5]):   # 7, 6 and 11 slots (at 3, one beside the pinned
        # pair, the hit rate is a few hot experts' luck: 24% predicted, 18% measured)
        measured = _bench_hit_rate(kvant_bin, olmoe, row["weights_memory"], row["slots"], tmp_path)
        assert abs(row["hit_rate"] - measured) <= 0.2 * measured, (row, measured)


def test_calibration_file_and_refusals(kvant_bin, olmoe, default_model, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    off = _plan(kvant_bin, olmoe, "2M", tmp_path, "--calibration", str(text))["weights_offload"]
    assert off["calibration"]["source"] == str(text)
    assert 32 < off["calibration"]["tokens"] <= 512
    assert 0 < off["decode"]["hit_rate"] <= 1
    # text output names the prediction
    r = _run([kvant_bin, "plan", "-m", olmoe, "--weights-memory", "2M", "-t", THREADS], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "decode: hit rate" in r.stdout and "other budgets, predicted" in r.stdout
    # --calibration means nothing without experts under a budget: refused, naming it
    for args in (["-m", olmoe], ["-m", default_model, "--weights-memory", "100M"]):
        r = _run([kvant_bin, "plan", *args, "--calibration", str(text)], tmp_path)
        assert r.returncode == 2 and "--calibration" in r.stderr, r.stderr
    r = _run([kvant_bin, "plan", "-m", olmoe, "--weights-memory", "2M", "--calibration",
              str(tmp_path / "missing.txt")], tmp_path)
    assert r.returncode == 1 and "missing.txt" in r.stderr, r.stderr
    # a budget below one token's experts: the smallest one named
    r = _run([kvant_bin, "plan", "-m", olmoe, "--weights-memory", "100K"], tmp_path)
    assert r.returncode == 1 and "need at least" in r.stderr, r.stderr
