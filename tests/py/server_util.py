"""Helpers for the `kvant serve` tests: start the server on a free port, wait for /health,
stop it, read /metrics.

KvantServer(bin, model, *args, port=None, base_args=BASE_ARGS): .url, .port, .proc; .stop(sig)
-> exit code.  A server that does not become healthy is a test FAILURE (never a skip), with its
stderr in the message.
The `server` fixture (module scope) is one server on the default model with a small KV pool.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

THREADS = os.environ.get("KVANT_THREADS", "2")
# Small, fixed KV pool and context so the tests are quick and use little memory.
BASE_ARGS = ["-t", THREADS, "--kv-blocks", "1024", "-c", "2048"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KvantServer:
    def __init__(self, kvant_bin: str, model: str, *args: str, health_timeout: float = 90.0,
                 preexec_fn=None, port: int | None = None, launcher: list[str] | None = None,
                 env: dict | None = None, base_args: list[str] | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="kvant-serve-", suffix=".log", delete=False)
        # launcher: a prefix such as ["mpirun", "-np", "2"] (tensor parallelism)
        cmd = [*(launcher or []), kvant_bin, "serve", "-m", model, "--port", str(self.port),
               *(BASE_ARGS if base_args is None else base_args), *args]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec_fn, env=env)
        deadline = time.time() + health_timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"kvant serve exited {self.proc.returncode} during start-up: "
                            f"{' '.join(cmd)}\n{self.log_text()}", pytrace=False)
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop(signal.SIGKILL)
                pytest.fail(f"kvant serve not healthy after {health_timeout}s\n{self.log_text()}",
                            pytrace=False)
            time.sleep(0.1)

    def log_text(self) -> str:
        try:
            with open(self.log.name, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def metrics(self, headers=None) -> dict:
        """{sample name with labels: value}, e.g. 'kvant_kv_blocks_used' or
        'kvant_request_success_total{finished_reason=stop}'."""
        r = httpx.get(self.url + "/metrics", headers=headers, timeout=10)
        assert r.status_code == 200, r.text
        out = {}
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                key = s.name
                if s.labels:
                    key += "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                out[key] = s.value
        return out

    def wait_idle(self, kv_baseline: float, timeout: float = 15.0) -> dict:
        """Polls /metrics until nothing runs or waits and KV used is back to kv_baseline."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            idle = (m["kvant_num_requests_running"] == 0 and m["kvant_num_requests_waiting"] == 0
                    and m["kvant_kv_blocks_used"] == kv_baseline)
            if idle or time.time() > deadline:
                return m
            time.sleep(0.1)


@pytest.fixture(scope="module")
def server(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model)
    yield s
    rc = s.stop()
    assert rc == 0, f"kvant serve exited {rc} on SIGTERM\n{s.log_text()}"


def module_server(*args):
    """A module-scoped `srv` fixture: the default model served with args,
    stopped after the module's tests (its exit status 0 asserted)."""
    @pytest.fixture(scope="module")
    def srv(kvant_bin, default_model):
        s = KvantServer(kvant_bin, default_model, *args)
        yield s
        assert s.stop() == 0, s.log_text()
    return srv


def module_openai_client(timeout=120):
    """A module-scoped `client` fixture: the official openai client on `srv`
    (no retries, so a refusal is seen as it is)."""
    import openai

    @pytest.fixture(scope="module")
    def client(srv):
        return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                             timeout=timeout)
    return client
