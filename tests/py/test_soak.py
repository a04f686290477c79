"""The soak (bench/soak.py, docs/RELIABILITY.md): its verdict catches a leak on synthetic
samples (RSS or a memory category trending up, KV blocks still used after traffic, fds or threads
not back to their idle value), and a 60-second run of mixed traffic against build/kvant passes
it: every request answered as expected, nothing trends upward over the second half, no KV block,
fd or thread left behind.  The 60-second report and plot go to build/test-results/."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import soak  # noqa: E402

MIB = 1 << 20


def _args(**kw):
    a = argparse.Namespace(rss_tol_mib=1.0, rss_floor_mib=4.0, count_tol=6.0, count_tol_kv=64,
                           idle_slack=0)
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _samples(rss_per_min=0.0, cat_per_min=0.0, n=600):
    out = []
    for t in range(n):
        out.append({"t": float(t), "rss": 200 * MIB + rss_per_min * MIB * t / 60.0 + (t % 7) * 4096,
                    "fds": 7 + t % 3, "threads": 7 + t % 3, "kv_used": float(t % 5),
                    "kv_cached": 100.0,
                    "mem": {"kv": 46 * MIB, "workspace": 2 * MIB + cat_per_min * MIB * t / 60.0}})
    return out


IDLE = {"fds": 7, "threads": 7, "kv_used": 0.0}


def test_verdict_flat_passes():
    v = soak.analyse(_samples(), 0, 599, IDLE, IDLE, _args())
    assert v["failures"] == [], v["failures"]
    assert abs(v["fits"]["rss"]["slope_per_min"]) < 0.1 * MIB


def test_verdict_catches_rss_growth():
    # 2 MiB/min over a 5-minute second half: 10 MiB rise > max(4, 1 * 5) MiB
    v = soak.analyse(_samples(rss_per_min=2.0), 0, 599, IDLE, IDLE, _args())
    assert any(f.startswith("rss trends upward") for f in v["failures"]), v["failures"]


def test_verdict_catches_a_memory_category_growing():
    v = soak.analyse(_samples(cat_per_min=0.5), 0, 599, IDLE, IDLE, _args())
    assert any(f.startswith("mem_workspace") for f in v["failures"]), v["failures"]


def test_verdict_catches_leaked_blocks_fds_threads():
    after = {"fds": 9, "threads": 8, "kv_used": 3.0}
    v = soak.analyse(_samples(), 0, 599, IDLE, after, _args())
    text = "\n".join(v["failures"])
    assert "3.0 KV blocks still used" in text and "fds: 9" in text and "threads: 8" in text, text


def test_soak_60s(kvant_bin, default_model, results_dir):
    out_json = results_dir / "soak60.json"
    out_png = results_dir / "soak60.png"
    cmd = [sys.executable, str(ROOT / "bench" / "soak.py"), "--duration", "60", "--bin", kvant_bin,
           "--model", default_model, "--json", str(out_json), "--png", str(out_png),
           "--", "--kv-blocks", "64"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    print(p.stdout[-3000:])
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    r = json.loads(out_json.read_text())
    assert r["pass"] and not r["failures"], r["failures"]
    assert r["requests"]["ok"] >= 30 and r["requests"]["failed"] == 0, r["requests"]
    assert r["kv_blocks_leaked"] == 0
    assert len(r["samples"]) >= 60
    assert out_png.stat().st_size > 10000
