"""Several models in one memory budget (`kvant serve -m a=... -m b=... -m c=...`).

Three small synthetic models of different architectures and weight types share a budget
that holds any two of them but not all three.  A randomized run sends requests in random
order and at random concurrency; every answer must equal the greedy answer of the same
model served alone, the memory in use (sampled from /metrics and /v1/models throughout)
never exceeds the budget, and no request is cut by an eviction: 1,000 requests
(KVANT_MULTI_REQUESTS), a few seconds on 2 cores since the models are tiny.

Bad input: an unknown model (404, OpenAI error shape), a model that can never fit (507 at
once, nothing evicted), a corrupt GGUF in --models-dir (listed as failed, the others
served), unload or sleep of a busy model (409), the life-cycle routes behind the API key.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from make_synthetic import make_model
from server_util import free_port

MODELS = {"a": "llama-F16", "b": "qwen2-Q8_0", "c": "llama-Q4_1"}
PROMPTS = ["hello", "the cat", "once upon a time", "abc def ghi", "12345", "zz top", "qwerty",
           "a b c d e f"]
MAX_TOKENS = 6
MULTI_REQUESTS = int(os.environ.get("KVANT_MULTI_REQUESTS", "1000"))
COMMON = ["-t", "1", "-c", "128", "--max-num-seqs", "8", "--max-num-batched-tokens", "128"]
JSON = {"Content-Type": "application/json"}


class Proc:
    """One `kvant serve` with the given arguments, healthy or a test failure."""

    def __init__(self, kvant_bin: str, *args: str, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="kvant-multi-", suffix=".log", delete=False)
        self.cmd = [kvant_bin, "serve", "--port", str(self.port), *COMMON, *args]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"kvant serve exited {self.proc.returncode}: {' '.join(self.cmd)}\n"
                            f"{self.text()}", pytrace=False)
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                pytest.fail(f"kvant serve not healthy\n{self.text()}", pytrace=False)
            time.sleep(0.05)

    def text(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()[-6000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def models(self, headers=None) -> dict:
        r = httpx.get(self.url + "/v1/models", headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def complete(self, client: httpx.Client, model: str, prompt: str, **kw) -> httpx.Response:
        body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **kw}
        return client.post(self.url + "/v1/completions", json=body, timeout=120)


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory) -> dict:
    d = str(tmp_path_factory.mktemp("multimodel"))
    return {k: make_model(d, v) for k, v in MODELS.items()}


@pytest.fixture(scope="module")
def reference(kvant_bin, model_paths) -> dict:
    """{(model, prompt): text} from each model served alone."""
    ref = {}
    for name, path in model_paths.items():
        s = Proc(kvant_bin, "-m", path)
        try:
            with httpx.Client() as c:
                for p in PROMPTS:
                    r = s.complete(c, os.path.basename(path)[:-5], p)
                    assert r.status_code == 200, r.text
                    ref[(name, p)] = r.json()["choices"][0]["text"]
        finally:
            assert s.stop() == 0, s.text()
    # the models differ, so routing mistakes show
    assert len({ref[(m, PROMPTS[0])] for m in MODELS}) == 3, ref
    return ref


def needs(kvant_bin, model_paths) -> dict:
    """Each model's planned footprint, from a server with room for all."""
    s = Proc(kvant_bin, *[a for k, p in model_paths.items() for a in ("-m", f"{k}={p}")])
    try:
        return {m["id"]: m["need_bytes"] for m in s.models()["data"]}
    finally:
        assert s.stop() == 0, s.text()


def metrics_sample(s: Proc) -> tuple[float, float, float]:
    """(used, budget, sum of per-model resident bytes) from /metrics."""
    text = httpx.get(s.url + "/metrics", timeout=30).text
    used = budget = res = 0.0
    for line in text.splitlines():
        if line.startswith("kvant_models_used_bytes "):
            used = float(line.split()[-1])
        elif line.startswith("kvant_models_budget_bytes "):
            budget = float(line.split()[-1])
        elif line.startswith("kvant_model_resident_bytes{"):
            res += float(line.split()[-1])
    return used, budget, res


def test_randomized_two_of_three(kvant_bin, model_paths, reference, default_model):
    need = needs(kvant_bin, model_paths)
    small = sorted(need.values())
    budget = small[1] + small[2] + small[0] // 2  # any two fit, never all three
    assert sum(small) > budget
    args = [a for k, p in model_paths.items() for a in ("-m", f"{k}={p}")]
    s = Proc(kvant_bin, *args, "-m", f"big={default_model}", "--device-memory", str(budget),
             "--memory-utilization", "1", "--queue-timeout", "120")
    samples, stop, bad = [], threading.Event(), []

    def sampler():
        while not stop.is_set():
            try:
                used, bud, res = metrics_sample(s)
                samples.append((used, bud, res))
                if used > bud or res > bud:
                    bad.append(("metrics", used, bud, res))
                mem = s.models()["memory"]
                if mem["used_bytes"] > mem["budget_bytes"]:
                    bad.append(("models", mem))
            except httpx.HTTPError as e:
                bad.append(("sampler", repr(e)))
            time.sleep(0.01)

    th = threading.Thread(target=sampler)
    th.start()
    rng = random.Random(1234)
    jobs = [(rng.choice(list(MODELS)), rng.choice(PROMPTS)) for _ in range(MULTI_REQUESTS)]
    results = []
    try:
        with httpx.Client(limits=httpx.Limits(max_connections=16)) as c:
            i = 0
            while i < len(jobs):  # bursts of random concurrency
                k = rng.randint(1, 8)
                burst = jobs[i:i + k]
                i += k
                with ThreadPoolExecutor(max_workers=k) as ex:
                    rs = list(ex.map(lambda j: s.complete(c, j[0], j[1]), burst))
                results += list(zip(burst, rs))
            # a model that can never fit is refused at once, nothing evicted for it
            before = {m["id"]: (m["evictions"], m["loads"]) for m in s.models()["data"]}
            t0 = time.time()
            r = s.complete(c, "big", "hello")
            assert time.time() - t0 < 5
            assert r.status_code == 507, r.text
            err = r.json()["error"]
            assert err["code"] == "model_too_large" and str(need_big(s)) in err["message"]
            after = {m["id"]: (m["evictions"], m["loads"]) for m in s.models()["data"]}
            assert before == after
    finally:
        stop.set()
        th.join()
        info = s.models()
        rc = s.stop()
    assert rc == 0, s.text()
    wrong = [(j, r.status_code, r.text[:200]) for j, r in results
             if r.status_code != 200 or r.json()["choices"][0]["text"] != reference[j]
             or r.json()["model"] != j[0]]
    assert not wrong, (wrong[:5], s.text())
    assert not bad, bad[:5]
    assert len(samples) >= 10 and max(u for u, _, _ in samples) > 0
    by = {m["id"]: m for m in info["data"]}
    loads = sum(by[m]["loads"] for m in MODELS)
    evictions = sum(by[m]["evictions"] for m in MODELS)
    # two fit at once: every third-model request after a switch evicts; no loop:
    # each eviction made room for exactly one load
    grows = sum(by[m]["kv_grows"] for m in MODELS)
    shrinks = sum(by[m]["kv_shrinks"] for m in MODELS)
    print(f"{len(results)} requests, {loads} loads, {evictions} evictions, {grows} KV grows, "
          f"{shrinks} KV shrinks, {len(samples)} samples")
    assert evictions >= 1 and evictions <= loads, by
    # the pools followed the load: grown into free memory, shrunk for the next load
    assert grows >= 1 and shrinks >= 1, by
    assert by["big"]["loads"] == 0 and by["big"]["state"] == "unloaded"
    assert "evicting" in s.text() and "(LRU, idle" in s.text()


def model_info(s: Proc) -> dict:
    return {m["id"]: m for m in s.models()["data"]}


def test_kv_follows_the_load(kvant_bin, model_paths, reference):
    """A's KV pool grows into the memory B gives back when it unloads, and shrinks (instead of
    A being evicted) when B loads again; answers stay those of each model alone, /v1/models
    and /metrics show the live pool, and the memory in use never exceeds the budget."""
    need = needs(kvant_bin, model_paths)
    # room for a, b and 16 blocks of a; a may grow to 64 requests of the context
    a0 = Proc(kvant_bin, "-m", f"a={model_paths['a']}", "-m", f"b={model_paths['b']}")
    try:
        share = model_info(a0)["a"]["kv_share_bytes"]
    finally:
        assert a0.stop() == 0, a0.text()
    bb = share // 16  # the share is 2 requests of 128 tokens: 16 blocks
    budget = need["a"] + need["b"] + 16 * bb
    s = Proc(kvant_bin, "-m", f"a={model_paths['a']}", "-m", f"b={model_paths['b']}",
             "--max-num-seqs", "64", "--device-memory", str(budget), "--memory-utilization", "1",
             "--queue-timeout", "60")
    samples, bad, stop = [], [], threading.Event()

    def sampler():
        while not stop.is_set():
            used, bud, res = metrics_sample(s)
            samples.append(used)
            if used > bud or res > bud:
                bad.append((used, bud, res))
            time.sleep(0.005)

    th = threading.Thread(target=sampler)
    th.start()

    def ask(c, model, n=8):
        with ThreadPoolExecutor(max_workers=n) as ex:
            rs = list(ex.map(lambda p: (p, s.complete(c, model, p)), PROMPTS[:n]))
        for p, r in rs:
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == reference[(model, p)], (model, p)

    try:
        with httpx.Client(limits=httpx.Limits(max_connections=16)) as c:
            ask(c, "a")
            alone = model_info(s)["a"]  # a alone: grown into all it can hold
            assert alone["kv_grows"] >= 1 and alone["kv_blocks_total"] > alone["kv_blocks_min"]
            assert alone["kv_blocks_total"] * bb >= need["b"]  # b cannot fit beside it as is
            ask(c, "b")
            both = model_info(s)
            # b fit because a gave blocks back; nobody was evicted
            assert both["a"]["kv_shrinks"] >= 1 and both["a"]["evictions"] == 0, both["a"]
            assert both["a"]["state"] == both["b"]["state"] == "loaded"
            assert both["a"]["kv_blocks_total"] < alone["kv_blocks_total"]
            # b unloads: a grows into its memory while serving
            th_a = threading.Thread(target=ask, args=(c, "a"))
            th_a.start()
            r = c.post(s.url + "/v1/models/b/unload", timeout=60)
            assert r.status_code == 200, r.text
            th_a.join()
            grown = model_info(s)["a"]
            assert grown["kv_grows"] > both["a"]["kv_grows"]
            assert grown["kv_blocks_total"] > both["a"]["kv_blocks_total"]
            assert grown["kv_pool_bytes"] == grown["kv_blocks_total"] * bb
            assert grown["resident_by_category"]["kv"] == grown["kv_pool_bytes"]
            # b loads again while a is busy: a shrinks (only blocks nobody holds), b waits
            # for the rest if it must; every answer stays right
            th_a = threading.Thread(target=ask, args=(c, "a"))
            th_a.start()
            ask(c, "b", 2)
            th_a.join()
            again = model_info(s)
            assert again["a"]["kv_shrinks"] > grown["kv_shrinks"], again["a"]
            assert again["a"]["evictions"] == 0 and again["b"]["state"] == "loaded"
            ask(c, "a")
            text = httpx.get(s.url + "/metrics", timeout=30).text
            assert f'kvant_model_kv_blocks{{model="a"}} {model_info(s)["a"]["kv_blocks_total"]}' \
                in text
            assert 'kvant_model_kv_resizes_total{model="a",direction="shrink"}' in text
    finally:
        stop.set()
        th.join()
        rc = s.stop()
    assert rc == 0, s.text()
    assert not bad, bad[:5]
    assert samples and max(samples) <= budget
    log = s.text()
    assert "kv: a grows" in log and "kv: a shrinks" in log and "to load b" in log, log
    print(f"a alone {alone['kv_blocks_total']} blocks, beside b {both['a']['kv_blocks_total']}, "
          f"after b unloaded {grown['kv_blocks_total']}, b back {again['a']['kv_blocks_total']}")


def need_big(s: Proc) -> int:
    return {m["id"]: m["need_bytes"] for m in s.models()["data"]}["big"]


def test_bad_input_and_lifecycle(kvant_bin, model_paths, tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    for k, p in model_paths.items():
        shutil.copy(p, d / f"{k}.gguf")
    (d / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + os.urandom(64))
    (d / "notes.txt").write_text("not a model")
    key = {"Authorization": "Bearer sekret"}
    s = Proc(kvant_bin, "--models-dir", str(d), "--api-key", "sekret", "--pin", "a")
    try:
        ms = {m["id"]: m for m in s.models(key)["data"]}
        assert set(ms) == {"a", "b", "c", "broken"}
        assert ms["broken"]["state"] == "failed" and ms["broken"]["error"]
        assert ms["a"]["state"] == "loaded" and ms["a"]["pinned"]
        a = ms["a"]
        assert 0 < a["resident_bytes"] <= a["need_bytes"] + a["kv_extra_bytes"]
        # room to spare: the pool grew past its share into memory no model could need
        assert a["kv_extra_bytes"] > 0 and a["kv_pool_bytes"] > a["kv_share_bytes"]
        assert ms["b"]["state"] == "unloaded" and ms["b"]["resident_bytes"] == 0
        with httpx.Client(headers=key) as c:
            # the others are served
            r = s.complete(c, "b", "hello")
            assert r.status_code == 200 and r.json()["model"] == "b", r.text
            r = s.complete(c, "broken", "hello")
            assert r.status_code == 500 and r.json()["error"]["code"] == "model_failed", r.text
            # unknown model: 404 in the OpenAI shape
            r = s.complete(c, "nope", "hello")
            assert r.status_code == 404, r.text
            e = r.json()["error"]
            assert e["code"] == "model_not_found" and e["param"] == "model" and "nope" in e["message"]
            assert e["type"] == "invalid_request_error"
            # life-cycle routes need the key
            assert httpx.post(s.url + "/v1/models/b/unload", timeout=30).status_code == 401
            # idle now: sleep 1, wake on request, sleep 2, explicit wake, unload
            r = c.post(s.url + "/v1/models/b/sleep", json={"level": 1}, timeout=30)
            assert r.status_code == 200 and r.json()["state"] == "sleeping", r.text
            assert r.json()["sleep_level"] == 1 and r.json()["resident_bytes"] == 0
            r = s.complete(c, "b", "hello")
            assert r.status_code == 200, r.text
            m = {m["id"]: m for m in s.models(key)["data"]}["b"]
            assert m["state"] == "loaded" and m["wakes"] == 1
            r = c.post(s.url + "/v1/models/b/sleep", json={"level": 2}, timeout=30)
            assert r.status_code == 200 and r.json()["sleep_level"] == 2, r.text
            r = c.post(s.url + "/v1/models/b/sleep", json={"level": 3}, timeout=30)
            assert r.status_code == 400, r.text
            r = c.post(s.url + "/v1/models/b/wake", timeout=30)
            assert r.status_code == 200 and r.json()["state"] == "loaded", r.text
            r = c.post(s.url + "/v1/models/b/unload", timeout=30)
            assert r.status_code == 200 and r.json()["state"] == "unloaded", r.text
            assert c.post(s.url + "/v1/models/nope/load", timeout=30).status_code == 404
            assert c.post(s.url + "/v1/models/b/explode", timeout=30).status_code == 404
            # /tokenize routes by model too
            r = c.post(s.url + "/tokenize", json={"model": "c", "prompt": "hi"}, timeout=30)
            assert r.status_code == 200 and r.json()["count"] > 0, r.text
        text = httpx.get(s.url + "/metrics", timeout=30).text
        for series in ('kvant_model_state{model="b",state="unloaded"} 1',
                       'kvant_model_wakes_total{model="b"} 2',
                       'kvant_model_sleeps_total{model="b"} 2',
                       'kvant_model_unloads_total{model="b"} 1',
                       'kvant_model_state{model="broken",state="failed"} 1',
                       'kvant_model_resident_bytes{model="a",category="weights"}',
                       'kvant_model_load_seconds_count{model="b"} 1',
                       'kvant_model_wake_seconds_count{model="b"} 2'):
            assert series in text, series
    finally:
        assert s.stop() == 0, s.text()


def test_busy_model_is_never_unloaded(testhooks_bin, model_paths, tmp_path):
    """A request in flight holds its model: unload and sleep answer 409, a load that needs
    its memory waits instead of evicting it.  The engine is held still with the test build's
    freeze hook (KVANT_TEST_FREEZE_FILE), so "in flight" does not depend on timing."""
    freeze = tmp_path / "freeze"
    need = {}
    s = Proc(testhooks_bin, "-m", f"a={model_paths['a']}", "-m", f"b={model_paths['b']}",
             "--queue-timeout", "1", env={"KVANT_TEST_FREEZE_FILE": str(freeze)})
    try:
        need = {m["id"]: m["need_bytes"] for m in s.models()["data"]}
    finally:
        assert s.stop() == 0, s.text()
    s = Proc(testhooks_bin, "-m", f"a={model_paths['a']}", "-m", f"b={model_paths['b']}",
             "--queue-timeout", "1", "--device-memory", str(max(need.values()) + 1000),
             "--memory-utilization", "1", env={"KVANT_TEST_FREEZE_FILE": str(freeze)})
    out = {}
    try:
        with httpx.Client() as c:
            assert s.complete(c, "a", "hello").status_code == 200
            freeze.write_text("")
            th = threading.Thread(target=lambda: out.setdefault("r", s.complete(c, "a", "hi")))
            th.start()
            deadline = time.time() + 30
            while time.time() < deadline:
                if {m["id"]: m for m in s.models()["data"]}["a"]["in_flight"] == 1:
                    break
                time.sleep(0.02)
            for act in ("unload", "sleep"):
                r = c.post(s.url + f"/v1/models/a/{act}", timeout=30)
                assert r.status_code == 409, r.text
                assert r.json()["error"]["code"] == "model_busy"
            # b needs a's memory: it waits for the queue timeout, then 503; a stays
            r = s.complete(c, "b", "hello")
            assert r.status_code == 503, r.text
            m = {m["id"]: m for m in s.models()["data"]}
            assert m["a"]["state"] == "loaded" and m["a"]["evictions"] == 0
            freeze.unlink()
            th.join(60)
            assert out["r"].status_code == 200, out["r"].text
            # idle now: b evicts a
            assert s.complete(c, "b", "hello").status_code == 200
            m = {m["id"]: m for m in s.models()["data"]}
            assert m["a"]["state"] == "unloaded" and m["a"]["evictions"] == 1
    finally:
        if freeze.exists():
            freeze.unlink()
        assert s.stop() == 0, s.text()


def test_keep_alive_and_single_alias(kvant_bin, model_paths):
    s = Proc(kvant_bin, "-m", f"a={model_paths['a']}", "-m", f"b={model_paths['b']}",
             "--keep-alive", "0.3s")
    try:
        with httpx.Client() as c:
            assert s.complete(c, "a", "hello").status_code == 200
        deadline = time.time() + 30
        state = None
        while time.time() < deadline:
            state = {m["id"]: m for m in s.models()["data"]}["a"]
            if state["state"] == "unloaded":
                break
            time.sleep(0.1)
        assert state["state"] == "unloaded" and state["unloads"] == 1, state
        assert "keep-alive: a idle" in s.text()
    finally:
        assert s.stop() == 0, s.text()
    # one -m NAME=PATH is the one-model server, under that name
    s = Proc(kvant_bin, "-m", f"solo={model_paths['c']}")
    try:
        data = s.models()["data"]
        assert [m["id"] for m in data] == ["solo"] and "state" not in data[0]
        assert httpx.post(s.url + "/v1/models/solo/unload", timeout=30).status_code == 404
    finally:
        assert s.stop() == 0, s.text()


@pytest.mark.parametrize("args,msg", [
    (["--kv-host-memory", "1G"], "offload"),
    (["--kv-blocks", "64"], "--kv-blocks"),
    (["--keep-alive", "soon"], "--keep-alive"),
])
def test_refused_options(kvant_bin, model_paths, args, msg):
    r = subprocess.run([kvant_bin, "serve", "-m", model_paths["a"], "-m", model_paths["b"], *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and msg in r.stderr, (r.returncode, r.stderr)
