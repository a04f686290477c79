"""The step budget (`kvant serve --max-itl-ms`, docs/SERVER.md "Step budget"): a long prompt that
arrives while another request decodes is spread over steps the budget allows (counted on
/metrics), the decoding request keeps getting tokens, and every output equals the one of a server
without the budget; bad values are refused at start-up naming the flag.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import subprocess
import threading

import httpx

from server_util import KvantServer, THREADS

ARGS = ["-t", THREADS, "--kv-blocks", "512", "-c", "1024"]


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("kvant_") and " " in line:
            name, val = line.rsplit(" ", 1)
            out[name] = float(val)
    return out


def _gen(url: str, prompt: list[int], n: int) -> str:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _stream(url: str, prompt: list[int], n: int, started: threading.Event) -> str:
    """Like _gen, streamed; `started` is set once four tokens have come (it decodes, and the
    server has timed steps to fit its step cost on)."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "stream": True}
    text = []
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                text.append(json.loads(line[6:])["choices"][0]["text"])
                if len(text) >= 4:
                    started.set()
    finally:
        started.set()
    return "".join(text)


def _pair(url: str) -> tuple[str, str]:
    """A 120-token generation, and once it is decoding (however slow the machine) a 700-token
    prompt."""
    short = [(7 * i + 3) % 4000 + 100 for i in range(8)]
    long = [(13 * i + 5) % 4000 + 100 for i in range(700)]
    started = threading.Event()
    with cf.ThreadPoolExecutor(2) as ex:
        a = ex.submit(_stream, url, short, 120, started)
        assert started.wait(300)
        b = ex.submit(_gen, url, long, 4)
        return a.result(), b.result()


def test_budget_spreads_a_long_prompt(kvant_bin, default_model):
    ref = KvantServer(kvant_bin, default_model, *ARGS, "--max-itl-ms", "0", base_args=[])
    try:
        want = _pair(ref.url)
        m = _metrics(ref.url)
        assert m["kvant_sched_itl_limited_steps_total"] == 0
        assert m["kvant_sched_step_token_budget"] == 2048
    finally:
        ref.stop()
    # 1 ms: below any step's cost on a CPU, so while the first request decodes every step holds
    # its decode and one token of the long prompt (the budget's floor)
    srv = KvantServer(kvant_bin, default_model, *ARGS, "--max-itl-ms", "1", base_args=[])
    try:
        got = _pair(srv.url)
        m = _metrics(srv.url)
    finally:
        srv.stop()
    assert got == want
    assert m["kvant_sched_itl_limited_steps_total"] >= 20, {k: v for k, v in m.items() if "sched" in k} # the prompt beside the decode
    assert m["kvant_sched_step_token_seconds"] > 0 and m["kvant_sched_step_base_seconds"] >= 0


def test_bad_values_refused(kvant_bin, default_model):
    for v in ("-1", "abc", "3600001"):
        p = subprocess.run([kvant_bin, "serve", "-m", default_model, "--max-itl-ms", v],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (v, p.returncode, p.stderr)
        assert "--max-itl-ms" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
