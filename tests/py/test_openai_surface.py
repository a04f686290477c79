"""The OpenAI surface as real clients use it, through the official openai client where it can
be: nothing silently ignored (every field implemented, allow-listed, or a 400 naming it;
--allow-unknown-fields logs unknown ones once), logit_bias (bans, boosts, batch-invariant),
the developer role, prompt lists, OpenAI's ranges, GET /v1/models/{id} and a stable `created`,
X-Request-Id on every response, CORS (--cors-origin), UTF-8-safe text cut at max_tokens,
501 for /v1/responses, and 503 + Retry-After past --max-connections."""
from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time

import httpx
import openai
import pytest

from server_util import KvantServer, THREADS, module_openai_client, module_server

MODEL = "SmolLM2-135M-Instruct.Q4_1"
ORIGIN = "http://app.example"
PROMPT = "The capital of France is"
HI = [{"role": "user", "content": "Hi"}]


srv = module_server("--cors-origin", ORIGIN,
                    "--cors-origin", "http://other.example")


client = module_openai_client()


def chat(client, **kw):
    kw.setdefault("messages", HI)
    kw.setdefault("max_tokens", 2)
    return client.chat.completions.create(model=MODEL, **kw)


def comp(client, **kw):
    kw.setdefault("prompt", PROMPT)
    kw.setdefault("max_tokens", 2)
    return client.completions.create(model=MODEL, **kw)


def token_id(srv, text):
    t = httpx.post(srv.url + "/tokenize", json={"prompt": text, "add_special_tokens": False},
                   timeout=30).json()["tokens"]
    return t[0]


# ---- no silent drops -------------------------------------------------------------------------

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# (name, api, extra fields, param the 400 must name)
REFUSED = [
    ("unknown top-level", "chat", {"foo": 1}, "foo"),
    ("unknown on completions", "comp", {"frobnicate": True}, "frobnicate"),
    ("vllm field kvant lacks", "comp", {"min_tokens": 3}, "min_tokens"),
    ("messages on completions", "comp", {"messages": HI}, "messages"),
    ("top_logprobs on completions", "comp", {"top_logprobs": 2}, "top_logprobs"),
    ("response_format unknown type", "chat", {"response_format": {"type": "xml"}},
     "response_format"),
    ("response_format json_schema without schema", "chat",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ("guided_regex not a string", "comp", {"guided_regex": 1}, "guided_regex"),
    ("tools not an array", "chat", {"tools": TOOL}, "tools"),
    ("tool_choice without tools", "chat", {"tool_choice": "auto"}, "tool_choice"),
    ("functions", "chat", {"functions": [TOOL["function"]]}, "functions"),
    ("function_call", "chat", {"function_call": "auto"}, "function_call"),
    ("parallel_tool_calls not a bool", "chat", {"parallel_tool_calls": "no"},
     "parallel_tool_calls"),
    ("audio", "chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("prediction", "chat", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("reasoning_effort", "chat", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("store true", "chat", {"store": True}, "store"),
    ("service_tier flex", "chat", {"service_tier": "flex"}, "service_tier"),
    ("modalities audio", "chat", {"modalities": ["text", "audio"]}, "modalities"),
    ("metadata not strings", "chat", {"metadata": {"a": 1}}, "metadata"),
    ("user not a string", "comp", {"user": 5}, "user"),
    ("stream_options without stream", "chat", {"stream_options": {"include_usage": True}},
     "stream_options"),
    ("stream_options unknown key", "chat",
     {"stream": True, "stream_options": {"include_usage": True, "x": 1}}, "stream_options"),
    ("max_tokens and max_completion_tokens differ", "chat",
     {"max_tokens": 2, "max_completion_tokens": 3}, "max_completion_tokens"),
    ("message name", "chat", {"messages": [{"role": "user", "content": "Hi", "name": "bob"}]},
     "messages[0].name"),
    ("message function_call (legacy)", "chat",
     {"messages": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "x",
                    "function_call": {"name": "f", "arguments": "{}"}}]},
     "messages[1].function_call"),
    ("message unknown field", "chat", {"messages": [{"role": "user", "content": "Hi", "x": 1}]},
     "messages[0].x"),
    ("content part unknown field", "chat",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "y": 2}]}]},
     "messages[0].content[0].y"),
    ("role function (legacy)", "chat", {"messages": [{"role": "function", "content": "1",
                                                       "name": "f"}]}, "messages"),
    ("more prompts than the bound", "comp", {"prompt": ["a"] * 129}, "prompt"),
    ("prompt list of strings and arrays", "comp", {"prompt": ["a", [3]]}, "prompt"),
    ("prompt list with an empty array", "comp", {"prompt": [[1, 2], []]}, "prompt"),
    ("empty prompt list", "comp", {"prompt": []}, "prompt"),
    # OpenAI's ranges
    ("temperature above 2", "chat", {"temperature": 2.5}, "temperature"),
    ("temperature negative", "comp", {"temperature": -0.1}, "temperature"),
    ("top_p zero", "chat", {"top_p": 0}, "top_p"),
    ("top_p above 1", "comp", {"top_p": 1.01}, "top_p"),
    ("presence_penalty below -2", "chat", {"presence_penalty": -2.5}, "presence_penalty"),
    ("frequency_penalty above 2", "comp", {"frequency_penalty": 2.01}, "frequency_penalty"),
    ("n zero", "chat", {"n": 0}, "n"),
    ("n over the bound", "comp", {"n": 17}, "n"),
    ("max_tokens zero", "chat", {"max_tokens": 0}, "max_tokens"),
    ("max_completion_tokens zero", "chat", {"max_tokens": None, "max_completion_tokens": 0},
     "max_completion_tokens"),
    ("top_logprobs over 20", "chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("logprobs over 20", "comp", {"logprobs": 21}, "logprobs"),
    ("logprobs negative", "comp", {"logprobs": -1}, "logprobs"),
    ("chat logprobs not a bool", "chat", {"logprobs": 1}, "logprobs"),
    # logit_bias
    ("logit_bias id out of range", "chat", {"logit_bias": {"10000000": -100}}, "logit_bias"),
    ("logit_bias id not a number", "comp", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("logit_bias negative id", "comp", {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("logit_bias id with leading zero", "comp", {"logit_bias": {"01": 1}}, "logit_bias"),
    ("logit_bias value too big", "chat", {"logit_bias": {"42": 100.5}}, "logit_bias"),
    ("logit_bias value a string", "comp", {"logit_bias": {"42": "x"}}, "logit_bias"),
    ("logit_bias not an object", "comp", {"logit_bias": [1, 2]}, "logit_bias"),
    ("logit_bias too many entries", "comp", {"logit_bias": {str(i): 1 for i in range(301)}},
     "logit_bias"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_with_400_naming_the_field(client, case):
    name, api, extra, param = case
    with pytest.raises(openai.BadRequestError) as ei:
        if api == "chat":
            chat(client, extra_body=extra)
        else:
            comp(client, extra_body=extra)
    err = ei.value
    assert err.status_code == 400
    assert err.param == param, (err.param, err.message)
    assert err.type == "invalid_request_error"
    assert set(err.body) == {"message", "type", "param", "code"}


def test_not_supported_yet_says_so(client):
    for extra in ({"audio": {"voice": "alloy", "format": "wav"}},
                  {"prediction": {"type": "content", "content": "x"}}):
        with pytest.raises(openai.BadRequestError) as ei:
            chat(client, extra_body=extra)
        assert "not supported yet" in ei.value.message, ei.value.message


def test_allow_list_accepted(client):
    c = chat(client, user="u-1", metadata={"k": "v"}, store=False, service_tier="auto",
             response_format={"type": "text"}, modalities=["text"],
             extra_body={"safety_identifier": "s", "prompt_cache_key": "p"})
    assert c.choices[0].message.content is not None
    c = comp(client, user="u-1", extra_body={"metadata": {"a": "b"}, "store": False,
                                             "service_tier": "default"})
    assert c.choices[0].text is not None


def test_null_fields_are_absent(client, srv):
    """A previous reply's message sent back as it is (its null fields included)."""
    first = chat(client, max_tokens=4, temperature=0)
    back = first.choices[0].message.model_dump()  # content, role, refusal/tool_calls/... None
    assert "tool_calls" in back and back["tool_calls"] is None
    msgs = HI + [back, {"role": "user", "content": "Thanks"}]
    body = {"model": MODEL, "messages": msgs, "max_tokens": 2, "tools": None,
            "tool_choice": None, "response_format": None, "logit_bias": None, "n": None,
            "stop": None, "seed": None, "user": None}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text


def test_allow_unknown_fields_flag(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model, "--allow-unknown-fields")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        for i in range(3):
            r = c.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi", "zz_msg": i}],
                max_tokens=2, extra_body={"zz_unknown": i},
                extra_headers={"X-Request-Id": f"allow-{i}"})
            assert r.http_response.status_code == 200
        r = httpx.post(s.url + "/v1/completions", timeout=120,
                       json={"prompt": PROMPT, "max_tokens": 2, "stream": True,
                             "stream_options": {"include_usage": True, "zz_opt": 1}})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text
        # the refused fields stay refused
        with pytest.raises(openai.BadRequestError) as ei:
            chat(c, extra_body={"functions": [TOOL["function"]]})
        assert ei.value.param == "functions"
        # without the flag an OPTIONS request is a 405, as before CORS existed
        r = httpx.options(s.url + "/v1/chat/completions", headers={"Origin": ORIGIN})
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert "access-control-allow-origin" not in r.headers
    finally:
        assert s.stop() == 0, s.log_text()
    log = s.log_text()
    assert log.count("unknown field 'zz_unknown'") == 1, log
    assert log.count("unknown field 'messages[].zz_msg'") == 1, log
    assert log.count("unknown field 'stream_options.zz_opt'") == 1, log
    assert "request allow-0: unknown field 'zz_unknown'" in log, log


# ---- logit_bias, developer role, prompt lists ------------------------------------------------

def test_logit_bias_ban_changes_the_greedy_token(client, srv):
    for api in ("comp", "chat"):
        if api == "comp":
            base = comp(client, max_tokens=1, temperature=0).choices[0].text
        else:
            base = chat(client, max_tokens=1, temperature=0).choices[0].message.content
        assert base, base
        tid = token_id(srv, base)
        assert httpx.post(srv.url + "/detokenize", json={"tokens": [tid]}).json()["prompt"] == base
        # the ban: the greedy token never comes, in any position
        kw = dict(max_tokens=6, temperature=0, logit_bias={str(tid): -100})
        if api == "comp":
            out = comp(client, **kw).choices[0].text
        else:
            out = chat(client, **kw).choices[0].message.content
        assert not out.startswith(base), (base, out)
        # a sampled request never draws it either
        kw = dict(max_tokens=1, temperature=1.0, seed=3, n=8, logit_bias={str(tid): -100})
        if api == "comp":
            outs = [ch.text for ch in comp(client, **kw).choices]
        else:
            outs = [ch.message.content for ch in chat(client, **kw).choices]
        assert base not in outs, outs


def test_logit_bias_boost_forces_a_token(client, srv):
    tid = token_id(srv, " banana")
    piece = httpx.post(srv.url + "/detokenize", json={"tokens": [tid]}).json()["prompt"]
    c = comp(client, max_tokens=3, temperature=0, logit_bias={str(tid): 100})
    assert c.choices[0].text.startswith(piece), (piece, c.choices[0].text)


def test_logit_bias_is_batch_invariant(client, srv):
    base = comp(client, max_tokens=1, temperature=0).choices[0].text
    bias = {str(token_id(srv, base)): -100, str(token_id(srv, " the")): 5}
    kw = dict(prompt=PROMPT, max_tokens=12, temperature=0, logit_bias=bias,
              extra_body={"ignore_eos": True})
    alone = comp(client, **kw).choices[0].text

    def other(i):
        return comp(client, prompt=f"Story {i}: once upon a time", max_tokens=24, temperature=0,
                    extra_body={"ignore_eos": True}).choices[0].text

    with cf.ThreadPoolExecutor(5) as ex:
        others = [ex.submit(other, i) for i in range(4)]
        time.sleep(0.3)  # the others are running when the biased one arrives
        batched = ex.submit(lambda: comp(client, **kw).choices[0].text).result()
        for f in others:
            f.result()
    assert batched == alone


def test_developer_role_is_system(client):
    sys_out = chat(client, messages=[{"role": "system", "content": "Answer in French."}] + HI,
                   max_tokens=8, temperature=0)
    dev_out = chat(client, messages=[{"role": "developer", "content": "Answer in French."}] + HI,
                   max_tokens=8, temperature=0)
    assert dev_out.choices[0].message.content == sys_out.choices[0].message.content
    assert dev_out.usage.prompt_tokens == sys_out.usage.prompt_tokens


def test_prompt_list_of_one(client, srv):
    a = comp(client, prompt=[PROMPT], max_tokens=4, temperature=0).choices[0].text
    b = comp(client, prompt=PROMPT, max_tokens=4, temperature=0).choices[0].text
    ids = httpx.post(srv.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    c = comp(client, prompt=[ids], max_tokens=4, temperature=0).choices[0].text
    assert a == b == c


def test_max_completion_tokens(client):
    c = chat(client, max_tokens=None, max_completion_tokens=3, temperature=0,
             extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 3
    c = chat(client, max_tokens=3, max_completion_tokens=3, temperature=0,
             extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 3


def test_chat_logprobs_bytes(client):
    c = chat(client, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    for e in c.choices[0].logprobs.content:
        assert e.bytes is not None and bytes(e.bytes).decode(errors="replace")
        assert all(t.bytes is not None for t in e.top_logprobs)


# ---- models, request ids, CORS, not implemented --------------------------------------------

def test_models_retrieve_and_stable_created(client):
    a = client.models.list().data[0]
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model" and m.owned_by == "kvant"
    time.sleep(1.1)
    b = client.models.list().data[0]
    assert a.created == b.created == client.models.retrieve(MODEL).created
    assert a.created <= time.time()
    with pytest.raises(openai.NotFoundError) as ei:
        client.models.retrieve("gpt-4o")
    assert ei.value.code == "model_not_found" and ei.value.param == "model"


def test_models_retrieve_several_models(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model, "-m", f"b={default_model}",
                    base_args=["-t", THREADS, "-c", "512"])  # several models: no --kv-blocks
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        ids = [m.id for m in c.models.list().data]
        assert ids == [MODEL, "b"], ids
        m = c.models.retrieve("b")
        assert m.id == "b" and m.model_extra["state"] in ("unloaded", "loaded")
        created = m.created
        time.sleep(1.1)
        assert c.models.retrieve("b").created == created
        assert [x.created for x in c.models.list().data][1] == created
        with pytest.raises(openai.NotFoundError) as ei:
            c.models.retrieve("zzz")
        assert ei.value.code == "model_not_found"
        # the routed model refuses unknown fields too
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model="b", messages=HI, max_tokens=2,
                                      extra_body={"zz": 1})
        assert ei.value.param == "zz"
    finally:
        assert s.stop() == 0, s.log_text()


def test_x_request_id(client, srv):
    r = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=HI, max_tokens=2, extra_headers={"X-Request-Id": "my-req-42"})
    assert r.headers["x-request-id"] == "my-req-42"
    assert r.parse()._request_id == "my-req-42"
    made = {httpx.get(srv.url + "/v1/models").headers["x-request-id"] for _ in range(3)}
    assert len(made) == 3 and all(x.startswith("req_") and len(x) == 36 for x in made), made
    # every kind of response carries one: errors, 404, health, metrics, streams
    for method, path, body in (("POST", "/v1/completions", {"prompt": PROMPT, "zz": 1}),
                               ("GET", "/nothing", None), ("GET", "/health", None),
                               ("GET", "/metrics", None), ("POST", "/v1/embeddings", {})):
        r = httpx.request(method, srv.url + path, json=body, headers={"X-Request-Id": "e-1"})
        assert r.headers.get("x-request-id") == "e-1", (path, r.status_code)
    with httpx.stream("POST", srv.url + "/v1/completions", headers={"X-Request-Id": "s-1"},
                      json={"prompt": PROMPT, "max_tokens": 2, "stream": True}) as r:
        assert r.headers["x-request-id"] == "s-1"
        r.read()
    # not echoed: too long, or not visible ASCII
    for bad in ("x" * 129, "has space"):
        got = httpx.get(srv.url + "/v1/models", headers={"X-Request-Id": bad}).headers
        assert got["x-request-id"].startswith("req_"), got


def test_cors(srv):
    pre = httpx.options(srv.url + "/v1/chat/completions",
                        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                 "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 204, pre.text
    h = pre.headers
    assert h["access-control-allow-origin"] == ORIGIN
    assert "POST" in h["access-control-allow-methods"]
    assert h["access-control-allow-headers"] == "authorization, content-type"
    assert int(h["access-control-max-age"]) > 0
    assert h["vary"] == "Origin"
    r = httpx.post(srv.url + "/v1/completions", headers={"Origin": "http://other.example"},
                   json={"prompt": PROMPT, "max_tokens": 1})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://other.example"
    assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
    bad = httpx.post(srv.url + "/v1/completions", json={"prompt": PROMPT, "zz": 1},
                     headers={"Origin": ORIGIN})
    assert bad.status_code == 400 and bad.headers["access-control-allow-origin"] == ORIGIN
    # an origin not allowed: no CORS headers, and its preflight is not answered
    r = httpx.get(srv.url + "/v1/models", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    r = httpx.options(srv.url + "/v1/chat/completions", headers={"Origin": "http://evil.example"})
    assert r.status_code == 405
    assert "access-control-allow-origin" not in httpx.get(srv.url + "/v1/models").headers


def test_cors_any_origin_with_api_key(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model, "--cors-origin", "*", "--api-key", "k1")
    try:
        pre = httpx.options(s.url + "/v1/models", headers={"Origin": "http://x.example"})
        assert pre.status_code == 204  # a preflight carries no key
        assert pre.headers["access-control-allow-origin"] == "*"
        assert "vary" not in pre.headers
        r = httpx.get(s.url + "/v1/models", headers={"Origin": "http://y.example"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "*"
    finally:
        assert s.stop() == 0, s.log_text()


def test_responses_is_501(client, srv):
    """(/v1/embeddings is implemented: test_embeddings.py.)"""
    r = httpx.post(srv.url + "/v1/responses", json={"model": MODEL, "input": "hi"})
    assert r.status_code == 501 and "not implemented yet" in r.json()["error"]["message"]


# ---- UTF-8 -------------------------------------------------------------------------------------

UTF8_MSGS = [{"role": "user", "content": "Write the Chinese word for 'love' in Chinese characters."}]


def valid_prefix(b: bytes) -> str:
    """b decoded, an incomplete trailing sequence dropped."""
    for cut in range(len(b), max(len(b) - 4, -1), -1):
        try:
            return b[:cut].decode()
        except UnicodeDecodeError:
            continue
    raise AssertionError(f"not UTF-8 even without its tail: {b!r}")


def test_utf8_cut_inside_a_character(client):
    full = chat(client, messages=UTF8_MSGS, max_tokens=24, temperature=0, logprobs=True,
                extra_body={"ignore_eos": True})
    toks = [bytes(e.bytes) for e in full.choices[0].logprobs.content]
    cuts = [k for k in range(1, len(toks) + 1) if valid_prefix(b"".join(toks[:k])).encode()
            != b"".join(toks[:k])]
    # the model writes CJK as byte tokens: the test needs cuts inside characters
    assert len(cuts) >= 3, (full.choices[0].message.content, toks)
    for k in cuts[:6]:
        want = valid_prefix(b"".join(toks[:k]))
        c = chat(client, messages=UTF8_MSGS, max_tokens=k, temperature=0,
                 extra_body={"ignore_eos": True})
        text = c.choices[0].message.content
        assert "\ufffd" not in text and text == want, (k, text, want)
        assert c.choices[0].finish_reason == "length"
        deltas = [ch.choices[0].delta.content or "" for ch in
                  chat(client, messages=UTF8_MSGS, max_tokens=k, temperature=0, stream=True,
                       extra_body={"ignore_eos": True}) if ch.choices]
        assert all("\ufffd" not in d for d in deltas), (k, deltas)
        assert "".join(deltas) == want


# ---- overload -------------------------------------------------------------------------------

def test_503_past_max_connections(kvant_bin, default_model):
    """Every one of --max-connections is serving a stream: a new connection gets 503 with
    Retry-After and an OpenAI-shaped body (not a closed socket), counted on /metrics; once the
    streams end, requests are served again."""
    s = KvantServer(kvant_bin, default_model, "--max-connections", "4")
    stop = threading.Event()
    started = threading.Semaphore(0)

    def hog(i):
        body = {"prompt": f"Story {i}:", "max_tokens": 1500, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            first = True
            for _ in r.iter_lines():
                if first:
                    started.release()
                    first = False
                if stop.is_set():
                    break

    try:
        before = s.metrics()
        ts = [threading.Thread(target=hog, args=(i,), daemon=True) for i in range(4)]
        for t in ts:
            t.start()
        for _ in ts:
            assert started.acquire(timeout=60)
        rs = [httpx.get(s.url + "/v1/models", timeout=10) for _ in range(3)]
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                       headers={"X-Request-Id": "over-1"}, timeout=10)
        stop.set()
        for t in ts:
            t.join(60)
        for x in rs + [r]:
            assert x.status_code == 503, (x.status_code, x.text)
            assert x.headers["retry-after"] == "1"
            assert x.headers.get("connection", "").lower() == "close"
            e = x.json()["error"]
            assert set(e) == {"message", "type", "param", "code"}
            assert e["code"] == "server_overloaded" and "--max-connections" in e["message"]
        assert r.headers["x-request-id"] == "over-1"
        deadline, polls = time.time() + 20, 0  # the hogs' connections close: served again
        while httpx.get(s.url + "/health", timeout=10).status_code == 503 and time.time() < deadline:
            polls += 1  # each one an overload answer too
            time.sleep(0.2)
        m = s.metrics()
        d = m["kvant_http_overload_responses_total"] - before["kvant_http_overload_responses_total"]
        assert d == 4 + polls, (d, polls)
        assert m["kvant_http_connections_refused_total"] == before["kvant_http_connections_refused_total"]
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                          timeout=60).status_code == 200
    finally:
        stop.set()
        assert s.stop() == 0, s.log_text()


def test_continuous_usage_stats(srv):
    """stream_options.continuous_usage_stats (vLLM's, sent by guidellm): the usage so far in
    every chunk, completion_tokens counting up to the final usage."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True,
            "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = []
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    text = [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert len(text) == 6 and all("usage" in c for c in chunks), chunks
    final = chunks[-1]["usage"]
    assert final["completion_tokens"] == 6
    assert [c["usage"]["completion_tokens"] for c in text] == list(range(1, 7))
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {final["prompt_tokens"]}
    r = httpx.post(srv.url + "/v1/completions", json={**body, "stream_options": {
        "continuous_usage_stats": "yes"}}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
