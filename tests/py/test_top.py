"""`kvant top URL` under tmux: the screen shows memory bars by category, KV usage and the running
requests, refreshes, and q quits; --json prints one summary per refresh; errors are clear."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import httpx
import pytest

from server_util import server  # noqa: F401  (fixture)


def tmux(*args: str, sock: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True,
                          timeout=20).stdout


def capture_until(sock: str, pred, timeout: float = 30.0) -> str:
    deadline = time.time() + timeout
    text = ""
    while time.time() < deadline:
        text = tmux("capture-pane", "-p", "-t", "top", sock=sock)
        if pred(text):
            return text
        time.sleep(0.2)
    return text


def test_top_under_tmux(server, kvant_bin, tmp_path):
    if shutil.which("tmux") is None:
        pytest.fail("tmux missing: install the Debian package `tmux` (scripts/setup-deps.sh)",
                    pytrace=False)
    sock = f"kvant-top-{server.port}"
    body = {"prompt": "Tell me a long story about terminals.", "max_tokens": 600, "stream": True,
            "ignore_eos": True}
    started = threading.Event()

    def load():
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                started.set()

    t = threading.Thread(target=load)
    t.start()
    try:
        assert started.wait(60)
        tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "40",
             f"{kvant_bin} top {server.url} --interval 0.5; echo TOP-EXIT=$?; sleep 30", sock=sock)
        screen = capture_until(sock, lambda s: "running 1" in s and "kv_tokens" in s)
        assert "kvant top" in screen and "weights" in screen and "kv " in screen, screen
        assert "[#" in screen, screen                   # a bar with something in it
        rows = [ln.split() for ln in screen.splitlines() if ln.strip()[:1].isdigit() and len(ln.split()) == 9]
        assert rows and int(rows[0][3]) > 0, screen     # a request row with generated tokens
        first_gen = int(rows[0][3])
        later = capture_until(sock, lambda s: any(
            ln.split()[:1] == rows[0][:1] and int(ln.split()[3]) > first_gen
            for ln in s.splitlines() if ln.strip()[:1].isdigit() and len(ln.split()) == 9))
        assert later != screen, "the view did not refresh"
        tmux("send-keys", "-t", "top", "q", sock=sock)
        done = capture_until(sock, lambda s: "TOP-EXIT=" in s)
        assert "TOP-EXIT=0" in done, done
    finally:
        tmux("kill-server", sock=sock)
        t.join(120)


def test_top_json_and_errors(server, kvant_bin):
    p = subprocess.run([kvant_bin, "top", server.url, "-n", "2", "--interval", "0.2", "--json"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(lines) == 2
    for j in lines:
        assert j["budget_bytes"] > 0 and "kv" in j["categories"] and 0 <= j["kv_usage_ratio"] <= 1
    bad = subprocess.run([kvant_bin, "top", "http://127.0.0.1:1", "-n", "1", "--json"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "cannot connect" in bad.stderr, bad.stderr
    for args in (["--interval", "0"], ["--bogus"], ["https://x"]):
        q = subprocess.run([kvant_bin, "top", *args], capture_output=True, text=True, timeout=10)
        assert q.returncode == 2 and q.stderr, (args, q.stderr)
    h = subprocess.run([kvant_bin, "top", "--help"], capture_output=True, text=True, timeout=10)
    assert h.returncode == 0 and "--interval" in h.stdout
