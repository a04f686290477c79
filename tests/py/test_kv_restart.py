"""The KV disk tier's hot set across restarts (write-through), through `kvant serve` on the
default model with a device pool large enough that nothing is evicted: what a restart would
lose without write-through is exactly the blocks still on the device.

- kill -9 after the blocks are on disk, restart, the same prompt: >= 90% of it cached, the same
  greedy text; asking again writes no second copy (files counted, dedup counted).
- control: --kv-disk-write evict loses the hot set on kill -9 (cached_tokens 0).
- SIGTERM right after the answer: the shutdown writes what was still queued, the restart serves it.
- flipped payload bytes in written-through records: never served, the text unchanged.
- --kv-host-memory larger than the free RAM is refused with the numbers; auto starts.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from server_util import KvantServer

POOL = ["--kv-blocks", "64"]  # 1024 tokens: the prompt's 12 full blocks stay on the device
BS = 16
PROMPT_LEN = 200              # 12 full blocks (192 tokens) can be cached: 96%
MAX_TOKENS = 8


def prompt(seed: int) -> list[int]:
    return [(seed * 7919 + j * 131 + 17) % 40000 + 100 for j in range(PROMPT_LEN)]


def complete(srv: KvantServer, seed: int) -> dict:
    body = {"prompt": prompt(seed), "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    j = r.json()
    return {"text": j["choices"][0]["text"],
            "cached": j["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)}


def records(d: Path) -> int:
    return sum(1 for n in os.listdir(d) if n.endswith(".kvb") and not n.startswith("."))


def wait_written(srv: KvantServer, n: int, timeout: float = 300.0) -> dict:
    """Polls /metrics until n records were written through and nothing is queued.  Each record
    is fsynced: beside other tests writing large files an fsync can take seconds (a CI run
    had 7 of 12 after 20 s, another 8 of 12 after 120 s), so the bound is generous; a passing
    run returns as soon as the records are there.  The returned metrics carry "_waited_s"."""
    t0 = time.time()
    while True:
        m = srv.metrics()
        if (m["kvant_kv_tier_write_through_records_total"] >= n
                and m["kvant_kv_tier_write_queue_depth"] == 0
                and m["kvant_kv_tier_write_through_waiting_blocks"] == 0) or time.time() > t0 + timeout:
            m["_waited_s"] = round(time.time() - t0, 1)
            return m
        time.sleep(0.05)


def tier_state(m: dict) -> dict:
    """The write-through metrics a failed count is explained by (queued, waiting, skipped,
    dropped, the writer's CPU time, how long the test waited)."""
    return {k: v for k, v in m.items()
            if k == "_waited_s" or "write_through" in k or "write_queue" in k
            or "writer_cpu" in k or "disk_write_drops" in k}


@pytest.fixture
def tier_dir(tier_dir_tmpfs):
    """This module's disk tiers on tmpfs (conftest's tier_dir_tmpfs: fsyncs beside other tests)."""
    return tier_dir_tmpfs


def tier_args(d: Path, *extra: str) -> list[str]:
    return [*POOL, "--kv-disk-dir", str(d), "--kv-disk-size", "256M", *extra]


FULL = (PROMPT_LEN - 1) // BS  # blocks a prompt fills (the last token is always computed)


def test_kill9_keeps_hot_set(kvant_bin, default_model, tier_dir):
    srv = KvantServer(kvant_bin, default_model, *tier_args(tier_dir))
    try:
        cold = complete(srv, 1)
        m = wait_written(srv, FULL)
    finally:
        srv.stop(signal.SIGKILL)
    assert cold["cached"] == 0
    assert m["kvant_kv_tier_write_through_enabled"] == 1
    assert m["kvant_kv_tier_write_through_records_total"] == FULL, tier_state(m)
    assert m["kvant_kv_tier_write_through_bytes_total"] > 0
    assert m["kvant_kv_tier_write_through_skipped_total{reason=queue_full}"] >= 0
    assert m["kvant_kv_tier_writer_cpu_seconds_total"] > 0
    # the blocks were still on the device: nothing was evicted to get them to disk
    assert m["kvant_kv_tier_evictions_total{tier=disk}"] == 0
    n_files = records(tier_dir)
    assert n_files == FULL

    srv = KvantServer(kvant_bin, default_model, *tier_args(tier_dir))
    try:
        warm = complete(srv, 1)
        again = complete(srv, 1)  # device prefix cache now
        m = wait_written(srv, 0)
    finally:
        assert srv.stop() == 0
    assert warm["text"] == cold["text"] and again["text"] == cold["text"]
    assert warm["cached"] >= 0.9 * PROMPT_LEN, warm
    assert warm["cached"] == FULL * BS
    assert m["kvant_kv_tier_hit_tokens_total{tier=disk}"] == FULL * BS
    # loaded blocks are offered again and found on disk: no second copy
    assert m["kvant_kv_tier_write_through_records_total"] == 0
    assert m["kvant_kv_tier_write_through_skipped_total{reason=dedup}"] >= FULL
    assert records(tier_dir) == n_files
    assert m["kvant_kv_tier_skipped_records_total{reason=corrupt}"] == 0


def test_evict_mode_loses_hot_set(kvant_bin, default_model, tier_dir):
    args = tier_args(tier_dir, "--kv-disk-write", "evict")
    srv = KvantServer(kvant_bin, default_model, *args)
    try:
        cold = complete(srv, 2)
        time.sleep(0.5)
        m = srv.metrics()
    finally:
        srv.stop(signal.SIGKILL)
    assert m["kvant_kv_tier_write_through_enabled"] == 0
    assert records(tier_dir) == 0
    srv = KvantServer(kvant_bin, default_model, *args)
    try:
        warm = complete(srv, 2)
    finally:
        assert srv.stop() == 0
    assert warm["cached"] == 0 and warm["text"] == cold["text"]


def test_sigterm_flushes(kvant_bin, default_model, tier_dir):
    srv = KvantServer(kvant_bin, default_model, *tier_args(tier_dir))
    try:
        cold = [complete(srv, s) for s in (3, 4, 5)]
    finally:
        assert srv.stop(signal.SIGTERM) == 0  # at once: writes may still be queued
    assert records(tier_dir) == 3 * FULL
    assert not any(n.startswith(".tmp.") for n in os.listdir(tier_dir))
    srv = KvantServer(kvant_bin, default_model, *tier_args(tier_dir))
    try:
        warm = [complete(srv, s) for s in (3, 4, 5)]
    finally:
        assert srv.stop() == 0
    for c, w in zip(cold, warm):
        assert w["text"] == c["text"] and w["cached"] == FULL * BS


def test_corrupt_written_through_never_served(kvant_bin, default_model, tier_dir):
    srv = KvantServer(kvant_bin, default_model, *tier_args(tier_dir))
    try:
        cold = complete(srv, 6)
        wait_written(srv, FULL)
    finally:
        srv.stop(signal.SIGKILL)
    for p in tier_dir.glob("*.kvb"):  # one flipped payload byte in every record
        with open(p, "r+b") as f:
            f.seek(-9, os.SEEK_END)
            b = f.read(1)
            f.seek(-9, os.SEEK_END)
            f.write(bytes([b[0] ^ 0x01]))
    srv = KvantServer(kvant_bin, default_model, *tier_args(tier_dir))
    try:
        warm = complete(srv, 6)
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    assert warm["text"] == cold["text"] and warm["cached"] == 0
    assert m["kvant_kv_tier_hit_tokens_total{tier=disk}"] == 0
    assert m["kvant_kv_tier_skipped_records_total{reason=corrupt}"] >= 1


def test_host_memory_against_ram(kvant_bin, default_model, tier_dir):
    r = subprocess.run([kvant_bin, "serve", "-m", default_model, *POOL, "--kv-host-memory",
                        "100T", "--port", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "--kv-host-memory" in r.stderr and "does not fit in RAM" in r.stderr, r.stderr
    assert "MemAvailable" in r.stderr and "MiB of weights" in r.stderr, r.stderr
    srv = KvantServer(kvant_bin, default_model, *POOL, "--kv-host-memory", "auto")
    try:
        complete(srv, 7)  # the tier stats are taken at the end of a step
        mem = httpx.get(srv.url + "/v1/memory", timeout=10).json()
    finally:
        assert srv.stop() == 0
    assert "--kv-host-memory auto:" in srv.log_text()
    host = mem["kv_tiers"]["host"]
    assert host["enabled"] and host["capacity_bytes"] > 0
    # auto takes at most half of what MemAvailable showed at start
    with open("/proc/meminfo") as f:
        avail = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    assert host["capacity_bytes"] <= 0.5 * avail * 1.25
