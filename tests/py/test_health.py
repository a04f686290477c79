"""/health tells the truth about the engine: with requests in flight and no engine step completed
within --health-stall-timeout, /health (and /ready) answer 503 "stalled" with a JSON reason; once
the engine moves again they answer 200, and the frozen request completes.

The engine is frozen through a hook that exists only in the test build build/kvant-testhooks
(engine.c compiled with KVANT_TEST_HOOKS; `make pytest` builds it): while the file named by
KVANT_TEST_FREEZE_FILE exists, the engine thread stops before its next step.  build/kvant has no
such hook (checked below: the same freeze file does not stop it)."""
from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from server_util import KvantServer

STALL_S = 1.5


def _complete(url, out):
    try:
        r = httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4,
                                                       "temperature": 0}, timeout=120)
        out["status"] = r.status_code
        out["body"] = r.json()
    except Exception as e:  # recorded, asserted by the caller
        out["error"] = repr(e)


def _wait_status(url, want, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        r = httpx.get(url + "/health", timeout=5)
        if r.status_code == want:
            return r, time.time() - t0
        time.sleep(0.1)
    return r, None


def _run_frozen(binary, model, freeze):
    """Starts a server, freezes the engine, sends a request; returns what /health said."""
    env_before = os.environ.get("KVANT_TEST_FREEZE_FILE")
    os.environ["KVANT_TEST_FREEZE_FILE"] = freeze
    try:
        s = KvantServer(binary, model, "--health-stall-timeout", str(STALL_S))
    finally:
        if env_before is None:
            del os.environ["KVANT_TEST_FREEZE_FILE"]
        else:
            os.environ["KVANT_TEST_FREEZE_FILE"] = env_before
    return s


def test_health_reports_a_frozen_engine(testhooks_bin, default_model):
    freeze = os.path.join(tempfile.mkdtemp(prefix="kvant-freeze-"), "freeze")
    s = _run_frozen(testhooks_bin, default_model, freeze)
    try:
        # idle: healthy, whatever the time since the last step
        time.sleep(STALL_S + 0.5)
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
        Path(freeze).touch()
        out: dict = {}
        t = threading.Thread(target=_complete, args=(s.url, out))
        t.start()
        r, took = _wait_status(s.url, 503, STALL_S + 10)
        assert took is not None, f"/health stayed {r.status_code} with a frozen engine"
        j = r.json()
        assert j["status"] == "stalled", j
        assert "no progress" in j["error"]["message"], j
        assert j["engine"]["in_flight"] >= 1 and j["engine"]["stalled_seconds"] > STALL_S, j
        assert httpx.get(s.url + "/ready", timeout=5).status_code == 503
        m = s.metrics()
        assert m["kvant_health_stalled_total"] >= 1
        assert m["kvant_engine_stalled_seconds"] > STALL_S
        assert t.is_alive(), "the request finished while the engine was frozen"
        os.unlink(freeze)  # unfreeze
        r, took2 = _wait_status(s.url, 200, 10)
        assert took2 is not None, f"/health still {r.status_code} after unfreezing: {r.text}"
        t.join(60)
        assert out.get("status") == 200, out
        assert out["body"]["usage"]["completion_tokens"] >= 1
        assert httpx.get(s.url + "/ready", timeout=5).status_code == 200
        print(f"health: 503 {took:.2f} s after the freeze (limit {STALL_S} s), "
              f"200 again {took2:.2f} s after unfreezing")
    finally:
        if os.path.exists(freeze):
            os.unlink(freeze)
        rc = s.stop()
    assert rc == 0, s.log_text()


def test_production_build_has_no_freeze_hook(kvant_bin, default_model):
    freeze = os.path.join(tempfile.mkdtemp(prefix="kvant-freeze-"), "freeze")
    Path(freeze).touch()
    s = _run_frozen(kvant_bin, default_model, freeze)
    try:
        out: dict = {}
        _complete(s.url, out)
        assert out.get("status") == 200, out
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
    finally:
        os.unlink(freeze)
        rc = s.stop()
    assert rc == 0, s.log_text()


def test_sigterm_while_the_engine_still_emits(testhooks_bin, default_model):
    """Regression: clients leave, SIGTERM arrives while their requests are still in the engine
    (frozen here), the engine then emits their final events during shutdown.  The server used to
    free its metrics before the engine stopped (a hang or crash at exit); it must exit 0."""
    freeze = os.path.join(tempfile.mkdtemp(prefix="kvant-freeze-"), "freeze")
    s = _run_frozen(testhooks_bin, default_model, freeze)
    try:
        ttft = []
        for i in range(4):  # streams in flight, then the engine freezes under them
            r = httpx.stream("POST", s.url + "/v1/completions",
                             json={"prompt": f"Story {i}:", "max_tokens": 500, "stream": True,
                                   "ignore_eos": True}, timeout=60)
            resp = r.__enter__()
            next(resp.iter_lines())
            ttft.append(r)
        Path(freeze).touch()
        time.sleep(0.3)
        for r in ttft:  # the clients leave while the engine is frozen
            r.__exit__(None, None, None)
        time.sleep(0.5)
        s.proc.send_signal(__import__("signal").SIGTERM)
        time.sleep(1.0)  # the drain finds no active HTTP request and returns
        os.unlink(freeze)  # the engine wakes and emits the cancelled requests' events
        rc = s.proc.wait(30)
    finally:
        if os.path.exists(freeze):
            os.unlink(freeze)
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    assert rc == 0, s.log_text()
    assert "kvant serve: stopped" in s.log_text()
