#!/usr/bin/env python3
"""Soak test of `kvant serve`: bounded mixed traffic, resources sampled every second, and a
verdict on whether anything grows (docs/RELIABILITY.md).

Traffic (open loop, Poisson arrivals at --rate requests/s, at most --max-inflight at once;
an arrival that finds the cap full is counted as `skipped`): chat and completions, streaming
and not, n > 1, stop strings, short and long prompts, prompts sharing a long prefix, streams
cancelled mid-way, non-streaming requests whose client gives up, bad requests (each must get
its 4xx), /metrics, /v1/memory and /tokenize polls.

Every second: the server's RSS (/proc/PID/status), open fds (/proc/PID/fd), threads
(/proc/PID/task), KV blocks used and cached and the memory manager's bytes per category
(/metrics), and the RSS that /v1/memory does not name (RSS - process.named_bytes: what is
left after the memory manager's resident pages, the engine's host buffers and code).

Verdict (exit 1 on any failure, the reasons in the report):
  - trend: a least-squares line over the second half of the traffic period (the first half is
    warm-up); its rise across that window must stay within the tolerance: RSS and unnamed RSS
    --rss-tol-mib MiB per minute (times the window's minutes, at least --rss-floor-mib),
    each memory-manager category 1 MiB, fds and threads --count-tol (they move with the
    connections in flight; the exact check is the next one);
  - idle: after traffic stops and the server is idle, KV blocks used must be 0 (leaked blocks),
    and fds and threads must be back to their value before traffic (within --idle-slack);
  - errors: any response other than the expected one for its kind (2xx, or the bad request's
    4xx; a client-cancelled request is expected to end early).

usage: .venv/bin/python bench/soak.py [--duration 600] [--rate 1] [--bin build/kvant]
       [--model M] [--json out.json] [--png out.png] [-- extra kvant serve args]
       (or --url URL --pid PID to soak a server started elsewhere)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import numpy as np

MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
# A small KV pool (128 blocks of 16 tokens, 47 MB on SmolLM2-135M at f16) so warm-up touches all
# of it (RSS plateaus) and preemption under pressure is part of the mix; short steps.
SERVE_ARGS = ["-t", "2", "--kv-blocks", "128", "-c", "1024", "--max-num-batched-tokens", "512"]
WARMUP_WORDS = 600   # warm-up prompts of about this many tokens (warm_up): the attention
                     # scratch and activations reach their largest (long_prompt stays below)
MIB = 1 << 20

PREFIX = ("You are a careful assistant for a small shop that sells tea, coffee and spices. "
          "Answer briefly and politely, and never invent prices. ") * 12
WORDS = ("tea coffee pepper cinnamon ginger cardamom green black oolong roast grind brew "
         "kettle cup spoon sugar milk honey lemon mint").split()


# ---- traffic -------------------------------------------------------------------------------

def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def kind_table():
    """(name, weight, function(url, rng) -> (ok: bool, tokens: int, note: str))."""
    return [
        ("chat", 3, req_chat),
        ("chat_stream", 3, req_chat_stream),
        ("completion_n", 2, req_completion_n),
        ("completion_stop_stream", 2, req_completion_stop_stream),
        ("long_prompt", 1, req_long_prompt),
        ("shared_prefix", 3, req_shared_prefix),
        ("cancel_stream", 2, req_cancel_stream),
        ("client_timeout", 1, req_client_timeout),
        ("bad_request", 2, req_bad),
        ("poll_memory", 1, req_poll_memory),
        ("poll_metrics", 1, req_poll_metrics),
        ("tokenize", 1, req_tokenize),
    ]


def usage_tokens(j) -> int:
    u = j.get("usage") or {}
    return int(u.get("prompt_tokens", 0)) + int(u.get("completion_tokens", 0))


def post(url, path, body, timeout=120.0):
    return httpx.post(url + path, json=body, timeout=timeout)


def req_chat(url, rng):
    r = post(url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Tell me about " + words(rng, 6)}],
        "max_tokens": rng.randint(4, 24), "temperature": rng.choice([0, 0.7])})
    if r.status_code != 200:
        return False, 0, f"status {r.status_code}: {r.text[:200]}"
    j = r.json()
    return j["choices"][0]["finish_reason"] in ("stop", "length"), usage_tokens(j), ""


def read_stream(r, cancel_after=None):
    """Reads SSE lines; returns (done, chunks, usage tokens, error)."""
    chunks, toks, err = 0, 0, None
    for line in r.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            return True, chunks, toks, err
        j = json.loads(data)
        if "error" in j:
            err = j["error"]
            continue
        if j.get("usage"):
            toks = usage_tokens(j)
        if j.get("choices"):
            chunks += 1
        if cancel_after is not None and chunks >= cancel_after:
            return False, chunks, toks, err
    return False, chunks, toks, err


def req_chat_stream(url, rng):
    body = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": words(rng, 10)}],
            "max_tokens": rng.randint(8, 32), "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.5, "seed": rng.randint(0, 9999)}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        if r.status_code != 200:
            return False, 0, f"status {r.status_code}"
        done, chunks, toks, err = read_stream(r)
    return done and err is None and chunks > 0, toks, "" if err is None else str(err)


def req_completion_n(url, rng):
    n = rng.randint(2, 4)
    r = post(url, "/v1/completions", {"prompt": "A list of " + words(rng, 4) + ":",
                                      "max_tokens": rng.randint(4, 16), "n": n,
                                      "temperature": 0.9, "seed": rng.randint(0, 9999)})
    if r.status_code != 200:
        return False, 0, f"status {r.status_code}: {r.text[:200]}"
    j = r.json()
    return len(j["choices"]) == n, usage_tokens(j), ""


def req_completion_stop_stream(url, rng):
    body = {"prompt": "Count: one, two, three,", "max_tokens": 24, "stream": True,
            "stop": [rng.choice([",", " six", "\n", "."])], "temperature": 0,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        if r.status_code != 200:
            return False, 0, f"status {r.status_code}"
        done, chunks, toks, err = read_stream(r)
    return done and err is None, toks, "" if err is None else str(err)


def req_long_prompt(url, rng):
    r = post(url, "/v1/completions", {"prompt": words(rng, rng.randint(150, 400)),
                                      "max_tokens": 8, "temperature": 0})  # 150-400 words
    if r.status_code != 200:
        return False, 0, f"status {r.status_code}: {r.text[:200]}"
    return True, usage_tokens(r.json()), ""


def req_shared_prefix(url, rng):
    r = post(url, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": PREFIX},
                     {"role": "user", "content": "Do you sell " + rng.choice(WORDS) + "?"}],
        "max_tokens": rng.randint(4, 12), "temperature": 0})
    if r.status_code != 200:
        return False, 0, f"status {r.status_code}: {r.text[:200]}"
    return True, usage_tokens(r.json()), ""


def req_cancel_stream(url, rng):
    body = {"prompt": words(rng, 20), "max_tokens": 64, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        if r.status_code != 200:
            return False, 0, f"status {r.status_code}"
        read_stream(r, cancel_after=rng.randint(1, 6))
    return True, 0, ""  # leaving the block closes the socket mid-stream


def req_client_timeout(url, rng):
    try:
        post(url, "/v1/completions", {"prompt": words(rng, 30), "max_tokens": 64,
                                      "ignore_eos": True}, timeout=rng.uniform(0.05, 0.5))
    except httpx.TimeoutException:
        pass  # the client gave up: the server must cancel the request
    return True, 0, ""


BAD = [
    ("/v1/completions", b"{not json", 400),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": -1}', 400),
    ("/v1/chat/completions", b'{"messages": "nope"}', 400),
    ("/v1/completions", b'{"prompt": "x", "n": 1000}', 400),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 100000}', 400),
    ("/v1/completions", b'{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', 400),
    ("/v1/nowhere", b"{}", 404),
]


def req_bad(url, rng):
    path, body, want = rng.choice(BAD)
    r = httpx.post(url + path, content=body, headers={"Content-Type": "application/json"},
                   timeout=30)
    ok = r.status_code == want and "error" in r.json()
    return ok, 0, "" if ok else f"{path} {body[:40]!r}: status {r.status_code}, wanted {want}"


def req_poll_memory(url, rng):
    r = httpx.get(url + "/v1/memory", timeout=30)
    return r.status_code == 200, 0, "" if r.status_code == 200 else f"status {r.status_code}"


def req_poll_metrics(url, rng):
    r = httpx.get(url + "/metrics", timeout=30)
    return r.status_code == 200, 0, "" if r.status_code == 200 else f"status {r.status_code}"


def req_tokenize(url, rng):
    r = post(url, "/tokenize", {"prompt": words(rng, 12)}, timeout=30)
    return r.status_code == 200 and r.json()["count"] > 0, 0, ""


class Traffic:
    def __init__(self, url, rate, max_inflight, seed):
        self.url, self.rate, self.max_inflight = url, rate, max_inflight
        self.rng = random.Random(seed)
        self.kinds = kind_table()
        self.stats = {k[0]: {"sent": 0, "ok": 0, "failed": 0} for k in self.kinds}
        self.errors: list[str] = []
        self.tokens = 0
        self.skipped = 0
        self.lock = threading.Lock()
        self.sem = threading.BoundedSemaphore(max_inflight)
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()

    def one(self, name, fn, seed):
        rng = random.Random(seed)
        try:
            ok, toks, note = fn(self.url, rng)
        except Exception as e:  # an exception is an unexpected error
            ok, toks, note = False, 0, repr(e)
        with self.lock:
            st = self.stats[name]
            st["ok" if ok else "failed"] += 1
            self.tokens += toks
            if not ok and len(self.errors) < 50:
                self.errors.append(f"{name}: {note}")
        self.sem.release()

    def run(self, duration):
        t_end = time.time() + duration
        weights = [k[1] for k in self.kinds]
        while time.time() < t_end and not self.stop.is_set():
            time.sleep(min(self.rng.expovariate(self.rate), max(0.0, t_end - time.time())))
            if time.time() >= t_end:
                break
            name, _, fn = self.rng.choices(self.kinds, weights)[0]
            if not self.sem.acquire(blocking=False):
                self.skipped += 1
                continue
            with self.lock:
                self.stats[name]["sent"] += 1
            t = threading.Thread(target=self.one, args=(name, fn, self.rng.randint(0, 1 << 30)),
                                 daemon=True)
            t.start()
            self.threads.append(t)
            self.threads = [x for x in self.threads if x.is_alive()]

    def join(self, timeout):
        t_end = time.time() + timeout
        for t in self.threads:
            t.join(max(0.1, t_end - time.time()))
        return sum(t.is_alive() for t in self.threads)


# ---- sampling --------------------------------------------------------------------------------

def parse_metrics(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, val = line.rpartition(" ")
        try:
            out[name] = float(val)
        except ValueError:
            pass
    return out


def proc_sample(pid: int) -> dict:
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return {"rss": rss, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": len(os.listdir(f"/proc/{pid}/task"))}


class Sampler:
    def __init__(self, url, pid, period=1.0):
        self.url, self.pid, self.period = url, pid, period
        self.samples: list[dict] = []
        self.t0 = time.time()
        self.stop = threading.Event()
        self.client = httpx.Client(timeout=10)
        self.errors = 0
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def sample(self) -> dict:
        s = {"t": time.time() - self.t0, **proc_sample(self.pid)}
        try:
            m = parse_metrics(self.client.get(self.url + "/metrics").text)
        except httpx.HTTPError:
            self.errors += 1
            m = {}
        s["kv_used"] = m.get("kvant_kv_blocks_used", float("nan"))
        s["kv_cached"] = m.get("kvant_kv_blocks_cached", float("nan"))
        s["running"] = m.get("kvant_num_requests_running", float("nan"))
        s["waiting"] = m.get("kvant_num_requests_waiting", float("nan"))
        s["mem"] = {k.split('"')[1]: v for k, v in m.items()
                    if k.startswith("kvant_device_memory_bytes{")}
        try:  # RSS that /v1/memory does not name (resident manager pages, engine, code)
            pr = self.client.get(self.url + "/v1/memory").json()["process"]
            s["unnamed"] = s["rss"] - pr["named_bytes"]
        except (httpx.HTTPError, KeyError, ValueError):
            self.errors += 1
            s["unnamed"] = float("nan")
        return s

    def loop(self):
        nxt = time.time()
        while not self.stop.is_set():
            self.samples.append(self.sample())
            nxt += self.period
            self.stop.wait(max(0.0, nxt - time.time()))

    def start(self):
        self.thread.start()

    def finish(self):
        self.stop.set()
        self.thread.join()
        self.client.close()


# ---- verdict --------------------------------------------------------------------------------

def fit_rise(ts, ys):
    """Slope (per minute) and rise across [ts[0], ts[-1]] of the least-squares line."""
    ts, ys = np.asarray(ts, float), np.asarray(ys, float)
    ok = np.isfinite(ys)
    ts, ys = ts[ok], ys[ok]
    if len(ts) < 3 or ts[-1] - ts[0] <= 0:
        return 0.0, 0.0
    slope = float(np.polyfit(ts, ys, 1)[0])
    return slope * 60.0, slope * float(ts[-1] - ts[0])


def analyse(samples, t_start, t_stop, idle_before, idle_after, args) -> dict:
    """Trend and idle checks; returns {"fits": ..., "failures": [...]}."""
    mid = t_start + (t_stop - t_start) / 2
    win = [s for s in samples if mid <= s["t"] <= t_stop]
    ts = [s["t"] for s in win]
    minutes = (t_stop - mid) / 60.0
    rss_tol = max(args.rss_floor_mib, args.rss_tol_mib * minutes) * MIB
    series = {"rss": ([s["rss"] for s in win], rss_tol),
              "unnamed": ([s.get("unnamed", float("nan")) for s in win], rss_tol),
              "fds": ([s["fds"] for s in win], args.count_tol),
              "threads": ([s["threads"] for s in win], args.count_tol),
              "kv_used": ([s["kv_used"] for s in win], args.count_tol_kv)}
    cats = sorted({c for s in win for c in s["mem"]})
    for c in cats:
        series["mem_" + c] = ([s["mem"].get(c, float("nan")) for s in win], 1.0 * MIB)
    fits, failures = {}, []
    for name, (ys, tol) in series.items():
        per_min, rise = fit_rise(ts, ys)
        fits[name] = {"slope_per_min": per_min, "rise": rise, "tolerance": tol,
                      "ok": rise <= tol}
        if rise > tol:
            failures.append(f"{name} trends upward over the second half: rise {rise:.4g} "
                            f"> tolerance {tol:.4g} ({per_min:.4g}/min)")
    if len(win) < 3:
        failures.append(f"only {len(win)} samples in the second half")
    if idle_after.get("kv_used", 0) != 0:
        failures.append(f"{idle_after.get('kv_used')} KV blocks still used after traffic "
                        "stopped (leaked)")
    for k in ("fds", "threads"):
        if idle_after[k] > idle_before[k] + args.idle_slack:
            failures.append(f"{k}: {idle_after[k]} after traffic vs {idle_before[k]} before "
                            f"(slack {args.idle_slack})")
    return {"window_s": [mid, t_stop], "fits": fits, "failures": failures}


def wait_idle(url, pid, timeout=60.0) -> dict:
    """Waits for no request running or waiting, KV used 0 and fds/threads settled."""
    t_end = time.time() + timeout
    last = None
    with httpx.Client(timeout=10) as c:
        while time.time() < t_end:
            m = parse_metrics(c.get(url + "/metrics").text)
            p = proc_sample(pid)
            cur = {"kv_used": m.get("kvant_kv_blocks_used"),
                   "kv_cached": m.get("kvant_kv_blocks_cached"),
                   "running": m.get("kvant_num_requests_running"),
                   "waiting": m.get("kvant_num_requests_waiting"), **p}
            quiet = cur["running"] == 0 and cur["waiting"] == 0 and cur["kv_used"] == 0
            if quiet and last and last["fds"] == cur["fds"] and last["threads"] == cur["threads"]:
                return cur
            last = cur
            time.sleep(0.5)
    return last or {}


def warm_up(url):
    """Before traffic: distinct long prompts until the prefix cache holds nearly the whole KV
    pool, so every KV page, the activations and the attention scratch have been touched and RSS
    measures growth, not first use."""
    rng = random.Random(0)
    for i in range(12):
        m = parse_metrics(httpx.get(url + "/metrics", timeout=30).text)
        cap = m.get("kvant_kv_blocks_capacity", 0)
        if i > 0 and m.get("kvant_kv_blocks_cached", 0) >= 0.95 * cap:
            return
        r = post(url, "/v1/completions", {"prompt": f"{i} " + words(rng, WARMUP_WORDS),
                                          "max_tokens": 4, "n": 2}, timeout=600)
        if r.status_code != 200:
            sys.exit(f"soak: warm-up request failed: {r.status_code} {r.text[:300]}")


def plot(samples, t_start, t_stop, report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = np.array([s["t"] for s in samples])
    fig, ax = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    ax[0].plot(t, [s["rss"] / MIB for s in samples], label="RSS")
    ax[0].plot(t, [s.get("unnamed", np.nan) / MIB for s in samples],
               label="RSS not named by /v1/memory")
    ax[0].set_ylabel("RSS (MiB)")
    cats = sorted({c for s in samples for c in s["mem"]})
    for c in cats:
        ax[1].plot(t, [s["mem"].get(c, np.nan) / MIB for s in samples], label=c)
    ax[1].set_ylabel("memory manager (MiB)")
    ax[1].legend(fontsize=7, loc="upper left")
    ax[2].plot(t, [s["kv_used"] for s in samples], label="KV blocks used")
    ax[2].plot(t, [s["kv_cached"] for s in samples], label="KV blocks cached")
    ax[2].set_ylabel("KV blocks")
    ax[2].legend(fontsize=7, loc="upper left")
    ax[3].plot(t, [s["fds"] for s in samples], label="open fds")
    ax[3].plot(t, [s["threads"] for s in samples], label="threads")
    ax[3].set_ylabel("count")
    ax[3].legend(fontsize=7, loc="upper left")
    ax[3].set_xlabel("seconds")
    w0, w1 = report["verdict"]["window_s"]
    fit = report["verdict"]["fits"]["rss"]
    tw = np.array([w0, w1])
    win = [s for s in samples if w0 <= s["t"] <= w1]
    if win:
        y0 = np.mean([s["rss"] for s in win]) / MIB
        slope = fit["slope_per_min"] / 60.0 / MIB
        tm = np.mean([s["t"] for s in win])
        ax[0].plot(tw, y0 + slope * (tw - tm), "r--", label=f"fit {fit['slope_per_min'] / MIB:+.3f} MiB/min")
        ax[0].legend(fontsize=7, loc="upper left")
    for a in ax:
        a.axvline(t_start, color="g", lw=0.8)
        a.axvline(t_stop, color="k", lw=0.8)
        a.axvspan(w0, w1, color="0.9", zorder=-1)
    st = "PASS" if report["pass"] else "FAIL"
    fig.suptitle(f"kvant soak: {report['duration_s']:.0f} s at {report['rate']} req/s, "
                 f"{report['requests']['ok']} requests ok, {st}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ---- main -------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, extra):
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="kvant-soak-", suffix=".log", delete=False)
    cmd = [args.bin, "serve", "-m", args.model, "--port", str(port), *SERVE_ARGS, *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    t_end = time.time() + 120
    while time.time() < t_end:
        if proc.poll() is not None:
            sys.exit(f"soak: kvant serve exited {proc.returncode}; log {log.name}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log.name
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"soak: kvant serve not healthy after 120 s; log {log.name}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=600, help="traffic seconds (default 600)")
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second (default 1)")
    ap.add_argument("--max-inflight", type=int, default=12,
                    help="requests in flight at most (default 12)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bin", default="build/kvant")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--url", help="soak a running server (needs --pid)")
    ap.add_argument("--pid", type=int, help="the running server's process id")
    ap.add_argument("--json", default="build/soak/soak.json")
    ap.add_argument("--png", default="build/soak/soak.png")
    ap.add_argument("--rss-tol-mib", type=float, default=1.0,
                    help="RSS rise allowed per minute of the second half (default 1 MiB)")
    ap.add_argument("--rss-floor-mib", type=float, default=4.0,
                    help="RSS rise always allowed over the second half (default 4 MiB)")
    ap.add_argument("--count-tol", type=float, default=None,
                    help="fds/threads rise allowed over the second half "
                         "(default: half of --max-inflight)")
    ap.add_argument("--count-tol-kv", type=float, default=64,
                    help="KV blocks used rise allowed over the second half (default 64)")
    ap.add_argument("--idle-slack", type=int, default=0,
                    help="fds/threads allowed above their pre-traffic value once idle")
    ap.add_argument("extra", nargs="*", help="after --: extra `kvant serve` arguments")
    args = ap.parse_args(argv)
    if args.count_tol is None:
        args.count_tol = args.max_inflight / 2
    proc = None
    if args.url:
        if not args.pid:
            ap.error("--url needs --pid")
        url, pid, log = args.url.rstrip("/"), args.pid, None
    else:
        proc, url, log = start_server(args, args.extra)
        pid = proc.pid
    try:
        sampler = Sampler(url, pid)
        sampler.start()
        warm_up(url)
        time.sleep(1.0)
        idle_before = wait_idle(url, pid, 10)
        t_start = time.time() - sampler.t0
        traffic = Traffic(url, args.rate, args.max_inflight, args.seed)
        traffic.run(args.duration)
        t_stop = time.time() - sampler.t0
        stuck = traffic.join(180)
        idle_after = wait_idle(url, pid, 60)
        time.sleep(2.0)
        sampler.finish()
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    verdict = analyse(sampler.samples, t_start, t_stop, idle_before, idle_after, args)
    req = {"sent": sum(s["sent"] for s in traffic.stats.values()),
           "ok": sum(s["ok"] for s in traffic.stats.values()),
           "failed": sum(s["failed"] for s in traffic.stats.values()),
           "skipped_at_cap": traffic.skipped, "by_kind": traffic.stats}
    failures = list(verdict["failures"])
    if req["failed"]:
        failures.append(f"{req['failed']} requests did not get the expected answer")
    if stuck:
        failures.append(f"{stuck} requests still in flight 180 s after traffic stopped")
    if proc is not None and rc != 0:
        failures.append(f"kvant serve exited {rc} on SIGTERM")
    rss = [s["rss"] for s in sampler.samples]
    report = {
        "duration_s": args.duration, "rate": args.rate, "max_inflight": args.max_inflight,
        "seed": args.seed, "requests": req, "tokens": traffic.tokens,
        "errors": traffic.errors, "sample_errors": sampler.errors,
        "rss_start_mib": rss[0] / MIB if rss else None,
        "rss_end_mib": rss[-1] / MIB if rss else None,
        "rss_max_mib": max(rss) / MIB if rss else None,
        "idle_before": idle_before, "idle_after": idle_after,
        "kv_blocks_leaked": idle_after.get("kv_used"),
        "traffic_window_s": [t_start, t_stop], "verdict": verdict,
        "failures": failures, "pass": not failures, "server_log": log,
        "samples": sampler.samples,
    }
    for p in (args.json, args.png):
        os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    plot(sampler.samples, t_start, t_stop, report, args.png)
    fr, fu = verdict["fits"]["rss"], verdict["fits"]["unnamed"]
    print(f"soak: {args.duration:.0f} s at {args.rate} req/s: {req['ok']}/{req['sent']} requests "
          f"as expected ({req['skipped_at_cap']} skipped at the in-flight cap), "
          f"{traffic.tokens} tokens; RSS {report['rss_start_mib']:.1f} -> "
          f"{report['rss_end_mib']:.1f} MiB, second-half slope "
          f"{fr['slope_per_min'] / MIB:+.3f} MiB/min (tolerance rise {fr['tolerance'] / MIB:.1f} "
          f"MiB), not named by /v1/memory {fu['slope_per_min'] / MIB:+.3f} MiB/min; fds {idle_before['fds']} -> {idle_after['fds']}, threads "
          f"{idle_before['threads']} -> {idle_after['threads']}, KV blocks leaked "
          f"{idle_after.get('kv_used')}; report {args.json}, plot {args.png}")
    for f_ in failures:
        print("soak: FAIL: " + f_)
    for e in traffic.errors[:10]:
        print("soak: error: " + e)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
