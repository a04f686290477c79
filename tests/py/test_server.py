"""`kvant serve` through the official openai client: completions and chat, streaming and not,
n=2, stop strings, usage (cached_tokens), logprobs, greedy output equal to `kvant run`,
/metrics movement, and a real Prometheus server scraping kvant."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time

import httpx
import openai
import pytest

from server_util import KvantServer, free_port, server  # noqa: F401  (fixture)

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_name(client):
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def test_models_and_health(server, model_name):
    assert model_name == "SmolLM2-135M-Instruct.Q4_1"
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_completion_greedy_matches_cli(client, model_name, run_kvant, default_model):
    n = 12
    r = run_kvant(["run", "-m", default_model, "-p", PROMPT, "-n", n, "--json", "-t", "2"])
    assert r.returncode == 0, r.stderr
    ref = json.loads(r.stdout)
    c = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=n, temperature=0)
    assert c.choices[0].text == ref["text"]
    assert c.usage.prompt_tokens == ref["prompt_tokens"]
    assert c.usage.completion_tokens == ref["completion_tokens"]
    assert c.choices[0].finish_reason == ref["finish_reason"]


def test_completion_default_max_tokens_is_16(client, model_name):
    c = client.completions.create(model=model_name, prompt="Once upon a time", temperature=0,
                                  extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 16
    assert c.choices[0].finish_reason == "length"


def test_completion_stream_equals_non_stream(client, model_name):
    full = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model=model_name, prompt=PROMPT, max_tokens=10,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == full.choices[0].text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].usage is not None and not chunks[-1].choices
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_stream_and_not(client, model_name):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a color."}]
    full = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=8,
                                          temperature=0)
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content
    assert full.usage.prompt_tokens > 10  # the template adds tokens
    chunks = list(client.chat.completions.create(model=model_name, messages=msgs, max_tokens=8,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_n2(client, model_name):
    c = client.completions.create(model=model_name, prompt="My favourite animal is", n=2,
                                  max_tokens=6, temperature=1.0, seed=7)
    assert sorted(ch.index for ch in c.choices) == [0, 1]
    assert all(ch.finish_reason in ("stop", "length") for ch in c.choices)
    assert c.usage.completion_tokens >= 2
    chunks = list(client.completions.create(model=model_name, prompt="My favourite animal is", n=2,
                                            max_tokens=6, temperature=1.0, seed=7, stream=True))
    seen = {ch.choices[0].index for ch in chunks if ch.choices}
    assert seen == {0, 1}


def test_stop_strings(client, model_name):
    base = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20,
                                     temperature=0).choices[0].text
    assert len(base) > 12, base
    stop = base[5:11]  # spans several tokens
    want = base[:base.index(stop)]
    c = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20, temperature=0,
                                  stop=[stop, "zzzz-never"])
    assert c.choices[0].text == want
    assert c.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20,
                                            temperature=0, stop=stop, stream=True))
    streamed = "".join(ch.choices[0].text for ch in chunks)
    assert streamed == want
    assert stop not in streamed
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_cached_tokens_on_repeated_prompt(client, model_name):
    long_prompt = " ".join(f"Sentence number {i} talks about the weather in town." for i in range(30))
    a = client.completions.create(model=model_name, prompt=long_prompt, max_tokens=2, temperature=0)
    b = client.completions.create(model=model_name, prompt=long_prompt, max_tokens=2, temperature=0)
    assert a.usage.prompt_tokens > 200
    assert b.usage.prompt_tokens == a.usage.prompt_tokens
    assert b.usage.prompt_tokens_details.cached_tokens > 0
    assert b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens


def test_logprobs(client, model_name):
    c = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0,
                                  logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(len(t) >= 1 for t in lp.top_logprobs)
    ch = client.chat.completions.create(model=model_name, max_tokens=3, temperature=0,
                                        messages=[{"role": "user", "content": "Hi"}],
                                        logprobs=True, top_logprobs=3)
    content = ch.choices[0].logprobs.content
    assert len(content) >= 1 and all(len(e.top_logprobs) == 3 for e in content)


def test_prompt_as_token_ids(server, client, model_name):
    toks = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}).json()
    assert toks["count"] == len(toks["tokens"]) > 0
    back = httpx.post(server.url + "/detokenize", json={"tokens": toks["tokens"]}).json()
    assert back["prompt"].endswith(PROMPT)
    a = client.completions.create(model=model_name, prompt=toks["tokens"], max_tokens=5, temperature=0)
    b = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5, temperature=0)
    assert a.choices[0].text == b.choices[0].text


def test_memory_report(server):
    r = httpx.get(server.url + "/v1/memory")
    assert r.status_code == 200
    assert isinstance(r.json(), dict) and r.json()


def test_metrics_move(server, client, model_name):
    m0 = server.metrics()
    kv0 = m0["kvant_kv_blocks_used"]
    c = client.completions.create(model=model_name, prompt="A unique prompt about turtles 12345",
                                  max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    m1 = server.wait_idle(kv0)
    assert m1["kvant_kv_blocks_used"] == kv0
    assert m1["kvant_num_requests_running"] == 0
    assert m1["kvant_generation_tokens_total"] - m0["kvant_generation_tokens_total"] >= 5
    assert m1["kvant_prompt_tokens_total"] > m0["kvant_prompt_tokens_total"]
    assert m1["kvant_request_success_total{finished_reason=length}"] == \
        m0["kvant_request_success_total{finished_reason=length}"] + 1
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
              "request_prompt_tokens", "request_generation_tokens"):
        assert m1[f"kvant_{h}_count"] == m0[f"kvant_{h}_count"] + 1, h
    assert m1["kvant_inter_token_latency_seconds_count"] - m0["kvant_inter_token_latency_seconds_count"] == 4
    assert m1["kvant_request_prompt_tokens_sum"] - m0["kvant_request_prompt_tokens_sum"] == c.usage.prompt_tokens
    for k in ("kvant_kv_blocks_capacity", "kvant_kv_block_size_tokens", "kvant_device_memory_budget_bytes",
              "kvant_kv_token_occupancy_ratio", "kvant_kv_usage_ratio", "kvant_kv_fragmentation_ratio",
              "kvant_device_memory_bytes{category=kv}", "kvant_prefix_cache_queries_tokens_total",
              "kvant_prefix_cache_hits_tokens_total", "kvant_num_preemptions_total"):
        assert k in m1, k
    assert m1["kvant_kv_blocks_capacity"] == 1024
    assert any(k.startswith("kvant_build_info{") for k in m1)


def test_metrics_after_disconnect(server, model_name):
    m0 = server.metrics()
    kv0 = m0["kvant_kv_blocks_used"]
    body = {"model": model_name, "prompt": "Tell me a very long story.", "max_tokens": 1500,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        n = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                n += 1
            if n >= 3:
                break
    m_mid = server.metrics()
    m1 = server.wait_idle(kv0, timeout=10)
    assert m1["kvant_num_requests_running"] == 0
    assert m1["kvant_kv_blocks_used"] == kv0
    assert m1["kvant_request_success_total{finished_reason=abort}"] == \
        m0["kvant_request_success_total{finished_reason=abort}"] + 1
    # it was cancelled, not run to the end
    assert m1["kvant_generation_tokens_total"] - m0["kvant_generation_tokens_total"] < 1500
    assert m_mid is not None


def test_prometheus_scrapes_kvant(server, tmp_path):
    prom = shutil.which("prometheus")
    if prom is None:
        pytest.fail("the `prometheus` binary is missing: install the Debian package `prometheus` "
                    "(scripts/setup-deps.sh)", pytrace=False)
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: kvant
    static_configs:
      - targets: ['127.0.0.1:{server.port}']
""")
    log = open(tmp_path / "prom.log", "w")
    p = subprocess.Popen([prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                          f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 40
        found = None
        while time.time() < deadline and found is None:
            time.sleep(1)
            if p.poll() is not None:
                break
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query",
                              params={"query": 'kvant_kv_blocks_capacity{job="kvant"}'}, timeout=5)
                res = r.json().get("data", {}).get("result", [])
                if res:
                    found = res
            except (httpx.HTTPError, ValueError):
                pass
        up = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}, timeout=5).json() \
            if p.poll() is None else None
    finally:
        p.terminate()
        p.wait(timeout=20)
        log.close()
    assert found, f"prometheus never stored kvant_kv_blocks_capacity; up={up}\n" + \
        (tmp_path / "prom.log").read_text()[-3000:]
    assert float(found[0]["value"][1]) == 1024
