"""KV offload tiers through `kvant serve` on the default model: a small device pool
(--kv-blocks 16) that a handful of long prompts overflow, so cached prefix blocks are
evicted down to the host and disk tiers and come back on the next request.

- host + disk: every answer (tokens and logprobs) equals the answer of a server without
  tiers; /metrics and /v1/memory report tier hits; kvant plan prints the tier sizes.
- kill -9, then a restart on the same directory: prompts are served from disk, unchanged.
- faults: flipped payload bytes, a foreign file and a leftover temporary file are skipped and
  counted; a --kv-disk-dir that is a file, a full disk (RLIMIT_FSIZE below one record) and a
  read-only directory (a read-only tmpfs mounted there when running as root, where file modes do
  not bind; mode 0555 otherwise) start the server without a disk tier (log line, metric) and
  every answer is still right.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from server_util import KvantServer

ROOT = Path(__file__).resolve().parent.parent.parent
POOL = ["--kv-blocks", "16"]  # 256 tokens: about two of the prompts below
N_PROMPTS = 6
PROMPT_LEN = 96
MAX_TOKENS = 4


def prompt(i: int) -> list[int]:
    return [(i * 7919 + j * 31 + 11) % 40000 + 100 for j in range(PROMPT_LEN)]


def complete(srv: KvantServer, i: int) -> dict:
    body = {"prompt": prompt(i), "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1,
            "ignore_eos": True}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    j = r.json()
    c = j["choices"][0]
    return {"text": c["text"], "logprobs": c["logprobs"]["token_logprobs"],
            "cached": j["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)}


def workload(srv: KvantServer) -> list[dict]:
    """Each prompt, then each prompt again (the second round finds them evicted)."""
    return [complete(srv, i % N_PROMPTS) for i in range(2 * N_PROMPTS)]


@pytest.fixture(scope="module")
def reference(kvant_bin, default_model):
    srv = KvantServer(kvant_bin, default_model, *POOL)
    try:
        out = workload(srv)
    finally:
        assert srv.stop() == 0
    return out


def same_answers(got: list[dict], want: list[dict]) -> None:
    for k, (g, w) in enumerate(zip(got, want)):
        assert g["text"] == w["text"], f"request {k}: {g['text']!r} != {w['text']!r}"
        assert g["logprobs"] == w["logprobs"], f"request {k}: logprobs differ"


def test_host_and_disk_tiers(kvant_bin, default_model, reference, tier_dir):
    srv = KvantServer(kvant_bin, default_model, *POOL, "--kv-host-memory", "4M",
                      "--kv-disk-dir", str(tier_dir), "--kv-disk-size", "64M")
    try:
        got = workload(srv)
        m = srv.metrics()
        mem = httpx.get(srv.url + "/v1/memory", timeout=10).json()
    finally:
        assert srv.stop() == 0
    same_answers(got, reference)
    assert all(g["cached"] == 0 for g in reference[N_PROMPTS:]), "reference must not hit"
    assert sum(g["cached"] for g in got[N_PROMPTS:]) > 0
    hits = m["kvant_kv_tier_hit_tokens_total{tier=host}"] + \
        m["kvant_kv_tier_hit_tokens_total{tier=disk}"]
    # a 4 MB host tier holds about 10 of the 36 blocks: the rest come back from disk
    assert m["kvant_kv_tier_hit_tokens_total{tier=disk}"] > 0
    assert m["kvant_kv_tier_store_bytes_total{tier=host}"] > 0
    assert m["kvant_kv_tier_store_bytes_total{tier=disk}"] > 0
    assert m["kvant_kv_tier_disk_enabled"] == 1
    assert m["kvant_kv_tier_skipped_records_total{reason=corrupt}"] == 0
    t = mem["kv_tiers"]
    assert t["enabled"] and t["host"]["enabled"] and t["disk"]["enabled"]
    assert t["host"]["capacity_blocks"] > 0 and t["disk"]["capacity_blocks"] > 0
    assert t["host"]["hit_tokens"] + t["disk"]["hit_tokens"] == hits
    # a clean shutdown leaves the cache on disk, records only (no temporary files)
    names = os.listdir(tier_dir)
    assert any(n.endswith(".kvb") for n in names)
    assert not any(n.startswith(".tmp.") for n in names)


def test_kill9_restart_serves_from_disk(kvant_bin, default_model, reference, tier_dir):
    args = [*POOL, "--kv-disk-dir", str(tier_dir), "--kv-disk-size", "64M"]
    srv = KvantServer(kvant_bin, default_model, *args)
    try:
        first = [complete(srv, i) for i in range(N_PROMPTS)]
    finally:
        srv.stop(signal.SIGKILL)
    same_answers(first, reference[:N_PROMPTS])
    srv = KvantServer(kvant_bin, default_model, *args)
    try:
        again = [complete(srv, i) for i in range(N_PROMPTS)]
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    same_answers(again, reference[N_PROMPTS:])
    # the prompts evicted before the kill come back from disk
    assert m["kvant_kv_tier_hit_tokens_total{tier=disk}"] > 0
    assert sum(g["cached"] for g in again) > 0
    assert m["kvant_kv_tier_skipped_records_total{reason=corrupt}"] == 0


def flip_payload_bytes(d: Path) -> int:
    n = 0
    for p in d.glob("*.kvb"):
        with open(p, "r+b") as f:
            f.seek(-5, os.SEEK_END)
            b = f.read(1)
            f.seek(-5, os.SEEK_END)
            f.write(bytes([b[0] ^ 0x40]))
        n += 1
    return n


def test_corrupt_and_foreign_records_are_skipped(kvant_bin, default_model, reference, tier_dir):
    args = [*POOL, "--kv-disk-dir", str(tier_dir), "--kv-disk-size", "64M"]
    srv = KvantServer(kvant_bin, default_model, *args)
    try:
        [complete(srv, i) for i in range(N_PROMPTS)]
    finally:
        assert srv.stop() == 0
    assert flip_payload_bytes(tier_dir) > 0
    (tier_dir / "README.txt").write_text("not a KV record\n")
    (tier_dir / ".tmp.0123.kvb").write_bytes(b"half a record")
    srv = KvantServer(kvant_bin, default_model, *args)
    try:
        again = [complete(srv, i) for i in range(N_PROMPTS)]
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    same_answers(again, reference[N_PROMPTS:])
    assert m["kvant_kv_tier_hit_tokens_total{tier=disk}"] == 0
    assert m["kvant_kv_tier_skipped_records_total{reason=corrupt}"] >= 2
    assert m["kvant_kv_tier_skipped_records_total{reason=foreign}"] >= 1
    assert (tier_dir / "README.txt").exists()
    assert not (tier_dir / ".tmp.0123.kvb").exists()


def _no_file_bigger_than_64k():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))


def _read_only_dir(d: Path) -> list[str]:
    """Makes d a read-only directory; returns the command that undoes it (empty: none)."""
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        return []
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "kvant-ro-test", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"running as root and cannot mount a read-only tmpfs: {r.stderr.strip()}")
    probe = d / "probe"
    with pytest.raises(OSError):
        probe.write_text("x")
    return ["umount", str(d)]


@pytest.mark.parametrize("case", ["dir_is_a_file", "disk_full", "read_only_dir"])
def test_unusable_disk_degrades(kvant_bin, default_model, reference, tier_dir, case):
    d = tier_dir / "cache"
    pre, undo = None, []
    if case == "dir_is_a_file":
        d.write_text("a file, not a directory\n")
    elif case == "disk_full":
        pre = _no_file_bigger_than_64k
    else:
        undo = _read_only_dir(d)
    try:
        srv = KvantServer(kvant_bin, default_model, *POOL, "--kv-host-memory", "32M",
                          "--kv-disk-dir", str(d), preexec_fn=pre)
        try:
            got = workload(srv)
            m = srv.metrics()
        finally:
            assert srv.stop() == 0
    finally:
        if undo:
            subprocess.run(undo, check=True)
        elif case == "read_only_dir":
            d.chmod(0o755)
    same_answers(got, reference)
    assert m["kvant_kv_tier_disk_enabled"] == 0
    assert m["kvant_kv_tier_disk_errors_total"] == 1
    assert m["kvant_kv_tier_hit_tokens_total{tier=host}"] > 0  # the host tier still works
    assert "KV disk tier disabled" in srv.log_text()


def test_tier_options(kvant_bin, default_model, tier_dir):
    r = subprocess.run([kvant_bin, "plan", "-m", default_model, "--kv-host-memory", "1Gi",
                        "--kv-disk-dir", str(tier_dir), "--kv-disk-size", "2Gi", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["kv_tiers"]
    assert t["host_bytes"] == 1 << 30 and t["disk_bytes"] == 2 << 30
    assert t["host_blocks"] == (1 << 30) // t["record_bytes"] > 0
    r = subprocess.run([kvant_bin, "plan", "-m", default_model, "--kv-disk-size", "2G"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--kv-disk-dir" in r.stderr
    r = subprocess.run([kvant_bin, "serve", "-m", default_model, "--kv-host-memory", "1K",
                        "--port", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "host" in r.stderr
    r = subprocess.run([kvant_bin, "serve", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert "--kv-host-memory" in r.stdout + r.stderr
