#!/usr/bin/env python3
"""Measures the KV disk tier's write-through and restart (issue 37's targets), through
`kvant serve`; indicative numbers: the machine may be shared.

startup   A directory of N real records (default 100,000), made by the server itself: a tiny
          synthetic model (tests/py/make_synthetic.py llama-F16, block size 8, 8 KiB records)
          served distinct prompts with write-through on, until N records are on disk.  Then
          kill -9 and time `kvant serve` from spawn to /ready on that directory, against the
          same start-up on an empty directory (the difference is the tier's).
restart   The default model: a disk tier filled to B blocks (default 10,000) by distinct
          prompts, one long prompt P served cold (its TTFT), kill -9, restart: time to /ready
          and P's TTFT again (served from disk), with its cached_tokens.
writer    The default model, 16 concurrent streams decoding with write-through on: the disk
          writer thread's CPU time (kvant_kv_tier_writer_cpu_seconds_total) against the wall
          time, and decode tokens/s with --kv-disk-write through vs evict.

usage: .venv/bin/python bench/kv_restart.py [startup|restart|writer|all] [--bin build/kvant]
       [--dir DIR (default: a directory under /dev/shm or build/bench)] [--records N]
       [--blocks B] [--json out.json]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary: str, model: str, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="kvant-bench-", suffix=".log", delete=False)
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([binary, "serve", "-m", model, "--port", str(self.port),
                                      *args], stdout=self.log, stderr=subprocess.STDOUT)
        self.ready_s = self._wait_ready()

    def _wait_ready(self, timeout: float = 300.0) -> float:
        while time.perf_counter() - self.t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvant serve exited: {open(self.log.name).read()[-2000:]}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return time.perf_counter() - self.t0
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        raise RuntimeError("not ready")

    def metrics(self) -> dict:
        out = {}
        for ln in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if ln and not ln.startswith("#"):
                k, v = ln.rsplit(" ", 1)
                out[k.replace('"', "")] = float(v)
        return out

    def stop(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=120)


def complete(url: str, prompt: list[int], max_tokens: int = 1) -> dict:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                   "temperature": 0, "ignore_eos": True},
                   timeout=600)
    r.raise_for_status()
    j = r.json()
    return {"s": time.perf_counter() - t0, "text": j["choices"][0]["text"],
            "cached": j["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0),
            "tokens": j["usage"]["completion_tokens"]}


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def n_records(d: str) -> int:
    return sum(1 for n in os.listdir(d) if n.endswith(".kvb") and not n.startswith("."))


def fill(url: str, d: str, want: int, plen: int, vocab: int, seed: int, jobs: int = 2,
         per_request: int = 16) -> int:
    """Distinct random prompts (per_request of them in each request's prompt list) until
    `want` records are on disk."""
    rng = random.Random(seed)

    def send(ps: list[list[int]]) -> None:
        r = httpx.post(url + "/v1/completions", json={"prompt": ps, "max_tokens": 1,
                                                       "temperature": 0}, timeout=600)
        r.raise_for_status()

    with cf.ThreadPoolExecutor(jobs) as ex:
        while n_records(d) < want:
            reqs = [[[rng.randrange(3, vocab) for _ in range(plen)] for _ in range(per_request)]
                    for _ in range(4 * jobs)]
            list(ex.map(send, reqs))
    time.sleep(1.0)
    return n_records(d)


def tier_dir(args, name: str) -> str:
    base = args.dir or ("/dev/shm" if os.path.isdir("/dev/shm") else os.path.join(ROOT, "build"))
    d = os.path.join(base, f"kvant-bench-{name}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def bench_startup(args) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
    from make_synthetic import make_model
    model = make_model(os.path.join(ROOT, "build", "bench"), "llama-F16")
    d = tier_dir(args, "startup")
    size = str(int(args.records * 9000 * 1.2))
    common = ["--block-size", "8", "--kv-blocks", "16384", "--max-num-seqs", "32",
              "--max-num-batched-tokens", "8192"]
    empty = tempfile.mkdtemp(prefix="kvant-empty-")
    base = Server(args.bin, model, *common, "--kv-disk-dir", empty, "--kv-disk-size", size)
    base_s = base.ready_s
    base.stop()
    srv = Server(args.bin, model, *common, "--kv-disk-dir", d, "--kv-disk-size", size)
    t0 = time.perf_counter()
    made = fill(srv.url, d, args.records, 240, 384, 1)
    fill_s = time.perf_counter() - t0
    m = srv.metrics()
    srv.stop(signal.SIGKILL)
    made = n_records(d)
    subprocess.run(["sync"])
    srv = Server(args.bin, model, *common, "--kv-disk-dir", d, "--kv-disk-size", size)
    ready_s = srv.ready_s
    rng = random.Random(1)  # fill's first prompt again: served from the directory
    first = [rng.randrange(3, 384) for _ in range(240)]
    hit = complete(srv.url, first)
    m2 = srv.metrics()
    srv.stop()
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(empty, ignore_errors=True)
    out = {"records": made, "fill_s": round(fill_s, 1),
           "written_through": m.get("kvant_kv_tier_write_through_records_total"),
           "ready_s": round(ready_s, 3), "ready_empty_dir_s": round(base_s, 3),
           "tier_share_s": round(ready_s - base_s, 3),
           "indexed_blocks": m2.get("kvant_kv_tier_blocks{tier=disk}"),
           "first_prompt_cached_tokens": hit["cached"]}
    print("startup:", json.dumps(out))
    return out


def bench_restart(args) -> dict:
    d = tier_dir(args, "restart")
    common = ["--kv-blocks", "512", "--max-num-seqs", "8", "--kv-disk-dir", d,
              "--kv-disk-size", str(int(args.blocks * 380_000 * 1.1))]
    srv = Server(args.bin, MODEL, *common)
    t0 = time.perf_counter()
    fill(srv.url, d, args.blocks - 64, 1024, 40000, 2, per_request=4)
    fill_s = time.perf_counter() - t0
    p = [random.Random(9).randrange(100, 40000) for _ in range(1025)]
    cold = complete(srv.url, p)
    time.sleep(1.0)
    srv.stop(signal.SIGKILL)
    blocks = n_records(d)
    srv = Server(args.bin, MODEL, *common)
    warm = complete(srv.url, p)
    m = srv.metrics()
    srv.stop()
    shutil.rmtree(d, ignore_errors=True)
    out = {"blocks_on_disk": blocks, "fill_s": round(fill_s, 1), "ready_s": round(srv.ready_s, 3),
           "cold_ttft_s": round(cold["s"], 4), "warm_ttft_s": round(warm["s"], 4),
           "ratio": round(warm["s"] / cold["s"], 3), "cached_tokens": warm["cached"],
           "prompt_tokens": len(p), "same_text": warm["text"] == cold["text"],
           "disk_hit_tokens": m.get("kvant_kv_tier_hit_tokens_total{tier=disk}")}
    print("restart:", json.dumps(out))
    return out


def decode_run(args, mode: str, streams: int = 16, max_tokens: int = 256) -> dict:
    d = tier_dir(args, "writer-" + mode)
    srv = Server(args.bin, MODEL, "--max-num-seqs", str(streams), "--kv-blocks", "2048",
                 "--kv-disk-dir", d, "--kv-disk-size", "4G", "--kv-disk-write", mode)
    rng = random.Random(5)
    prompts = [[rng.randrange(100, 40000) for _ in range(128)] for _ in range(streams)]
    m0 = srv.metrics()
    c0 = proc_cpu_s(srv.proc.pid)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(streams) as ex:
        res = list(ex.map(lambda q: complete(srv.url, q, max_tokens), prompts))
    wall = time.perf_counter() - t0
    proc_cpu = proc_cpu_s(srv.proc.pid) - c0
    time.sleep(0.5)
    m1 = srv.metrics()
    srv.stop()
    shutil.rmtree(d, ignore_errors=True)
    cpu = (m1["kvant_kv_tier_writer_cpu_seconds_total"]
           - m0.get("kvant_kv_tier_writer_cpu_seconds_total", 0.0))  # no step yet: no tier metrics
    return {"mode": mode, "wall_s": round(wall, 2),
            "decode_tok_s": round(sum(r["tokens"] for r in res) / wall, 1),
            "writer_cpu_s": round(cpu, 4), "writer_cpu_share_of_wall": round(cpu / wall, 4),
            "process_cpu_s": round(proc_cpu, 2),
            "writer_share_of_process_cpu": round(cpu / proc_cpu, 5) if proc_cpu > 0 else None,
            "records": m1["kvant_kv_tier_write_through_records_total"],
            "queue_full": m1["kvant_kv_tier_write_through_skipped_total{reason=queue_full}"]}


def bench_writer(args) -> dict:
    through = decode_run(args, "through")
    evict = decode_run(args, "evict")
    out = {"through": through, "evict": evict,
           "throughput_ratio": round(through["decode_tok_s"] / evict["decode_tok_s"], 3)}
    print("writer:", json.dumps(out))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", nargs="?", default="all", choices=["startup", "restart", "writer", "all"])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "kvant"))
    ap.add_argument("--dir", default=None)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--blocks", type=int, default=10_000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = {}
    for name, fn in (("startup", bench_startup), ("restart", bench_restart),
                     ("writer", bench_writer)):
        if args.what in (name, "all"):
            out[name] = fn(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
