"""Bad requests to `kvant serve`: each gets the right status and an OpenAI-shaped error body
{"error": {"message", "type", "param", "code"}}, nothing is streamed first, and afterwards the
server still answers a normal request.  Also: 503 + Retry-After when the waiting queue is full."""
from __future__ import annotations

import concurrent.futures as cf

import httpx
import pytest

from server_util import KvantServer, module_server

KEY = "sk-test-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 100_000
MODEL = "SmolLM2-135M-Instruct.Q4_1"
C = "/v1/completions"
CH = "/v1/chat/completions"


srv = module_server("--api-key", KEY, "--max-body", str(MAX_BODY))


def comp(**kw):
    d = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
    d.update(kw)
    return d


def chat(**kw):
    d = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    d.update(kw)
    return d


J = {"Content-Type": "application/json"}
nested = "[" * 40_000 + "]" * 40_000  # deeper than jansson's 2048 limit, under MAX_BODY

# (name, method, path, json body | raw bytes | None, extra headers, status, param or None)
CASES = [
    ("malformed json", "POST", C, b'{"prompt": "x",', J, 400, None),
    ("empty body", "POST", C, b"", J, 400, None),
    ("body not an object", "POST", C, b"[1,2]", J, 400, None),
    ("invalid utf-8", "POST", C, b'{"prompt": "\xff\xfe"}', J, 400, None),
    ("deeply nested", "POST", C, nested.encode(), J, 400, None),
    ("huge number", "POST", C, b'{"prompt":"x","max_tokens":1e999}', J, 400, None),
    ("huge integer", "POST", C, b'{"prompt":"x","max_tokens":123456789012345678901234567890}', J, 400, None),
    ("duplicate keys", "POST", C, b'{"prompt":"x","prompt":"y"}', J, 400, None),
    ("missing prompt", "POST", C, {"model": MODEL}, None, 400, "prompt"),
    ("prompt wrong type", "POST", C, comp(prompt=5), None, 400, "prompt"),
    ("prompt ids out of range", "POST", C, comp(prompt=[1, 2, 10_000_000]), None, 400, "prompt"),
    ("prompt negative id", "POST", C, comp(prompt=[-1]), None, 400, "prompt"),
    ("prompt mixed array", "POST", C, comp(prompt=[1, "a"]), None, 400, "prompt"),
    ("temperature negative", "POST", C, comp(temperature=-0.5), None, 400, "temperature"),
    ("temperature string", "POST", C, comp(temperature="hot"), None, 400, "temperature"),
    ("top_p zero", "POST", C, comp(top_p=0), None, 400, "top_p"),
    ("top_p above one", "POST", C, comp(top_p=1.5), None, 400, "top_p"),
    ("min_p above one", "POST", C, comp(min_p=2), None, 400, "min_p"),
    ("top_k float", "POST", C, comp(top_k=1.5), None, 400, "top_k"),
    ("n zero", "POST", C, comp(n=0), None, 400, "n"),
    ("n too big", "POST", C, comp(n=17), None, 400, "n"),
    ("max_tokens zero", "POST", C, comp(max_tokens=0), None, 400, "max_tokens"),
    ("max_tokens over context", "POST", C, comp(max_tokens=5000), None, 400, "max_tokens"),
    ("prompt over context", "POST", C, comp(prompt=[1] * 2100, max_tokens=1), None, 400, "prompt"),
    ("too many stops", "POST", C, comp(stop=["a", "b", "c", "d", "e"]), None, 400, "stop"),
    ("overlong stop", "POST", C, comp(stop="x" * 300), None, 400, "stop"),
    ("stop wrong type", "POST", C, comp(stop=5), None, 400, "stop"),
    ("presence penalty range", "POST", C, comp(presence_penalty=3), None, 400, "presence_penalty"),
    ("stream not bool", "POST", C, comp(stream="yes"), None, 400, "stream"),
    ("stream bad params", "POST", C, comp(stream=True, temperature=-1), None, 400, "temperature"),
    ("logprobs too many", "POST", C, comp(logprobs=50), None, 400, "logprobs"),
    ("echo not a bool", "POST", C, comp(echo="yes"), None, 400, "echo"),
    ("max_tokens zero without echo", "POST", C, comp(echo=False, max_tokens=0), None, 400,
     "max_tokens"),
    ("echo on chat", "POST", CH, chat(echo=True), None, 400, "echo"),
    ("unknown model", "POST", C, comp(model="gpt-4"), None, 404, "model"),
    ("chat no messages", "POST", CH, {"model": MODEL}, None, 400, "messages"),
    ("chat empty messages", "POST", CH, chat(messages=[]), None, 400, "messages"),
    ("chat bad role", "POST", CH, chat(messages=[{"role": "wizard", "content": "x"}]), None, 400, "messages"),
    ("chat content number", "POST", CH, chat(messages=[{"role": "user", "content": 1}]), None, 400, "messages"),
    ("chat top_logprobs without logprobs", "POST", CH, chat(top_logprobs=2), None, 400, "top_logprobs"),
    ("chat unknown model", "POST", CH, chat(model="nope"), None, 404, "model"),
    ("wrong content type", "POST", C, b'{"prompt":"x"}', {"Content-Type": "text/plain"}, 415, None),
    ("form content type", "POST", C, b"prompt=x", {"Content-Type": "application/x-www-form-urlencoded"}, 415, None),
    ("body over limit", "POST", C, b'{"prompt":"' + b"a" * (MAX_BODY + 10) + b'"}', J, 413, None),
    ("wrong method completions", "GET", C, None, None, 405, None),
    ("wrong method models", "POST", "/v1/models", b"{}", J, 405, None),
    ("wrong method health", "DELETE", "/health", None, None, 405, None),
    ("unknown route", "GET", "/v1/nothing", None, None, 404, None),
    ("unknown route post", "POST", "/v2/completions", comp(), None, 404, None),
    ("tokenize bad prompt", "POST", "/tokenize", {"prompt": 5}, None, 400, "prompt"),
    ("detokenize bad ids", "POST", "/detokenize", {"tokens": [1, 99999999]}, None, 400, "tokens"),
    ("detokenize not array", "POST", "/detokenize", {"tokens": "abc"}, None, 400, "tokens"),
]


def send(srv, method, path, body, headers, auth=AUTH):
    h = dict(auth)
    if headers:
        h.update(headers)
    kw = {}
    if isinstance(body, (bytes, bytearray)):
        kw["content"] = bytes(body)
    elif body is not None:
        kw["json"] = body
    return httpx.request(method, srv.url + path, headers=h, timeout=60, **kw)


def check_error(r, status, param=None):
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    assert isinstance(e["type"], str) and e["type"]
    if param is not None:
        assert e["param"] == param, e


def test_case_count():
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request(srv, case):
    name, method, path, body, headers, status, param = case
    r = send(srv, method, path, body, headers)
    check_error(r, status, param)
    if status == 405:
        assert r.headers.get("allow") in ("GET", "POST")


@pytest.mark.parametrize("auth", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                  {"Authorization": f"Bearer {KEY}x"}],
                         ids=["missing", "wrong", "no-bearer", "longer"])
def test_bad_api_key(srv, auth):
    for path, body in ((C, comp()), (CH, chat()), ("/v1/models", None)):
        r = send(srv, "POST" if body else "GET", path, body, None, auth=auth)
        check_error(r, 401)


def test_health_and_metrics_need_no_key(srv):
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.get(srv.url + "/metrics").status_code == 200


def test_still_serves_after_bad_requests(srv):
    for case in CASES[:10]:
        send(srv, case[1], case[2], case[3], case[4])
    r = send(srv, "POST", C, comp(max_tokens=4, temperature=0), None)
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["choices"][0]["text"] and j["usage"]["completion_tokens"] >= 1
    r = send(srv, "POST", CH, chat(max_tokens=3), None)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_queue_full_503(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model, "--max-num-seqs", "1", "--max-waiting", "1")
    try:
        before = s.metrics()["kvant_requests_queue_full_total"]
        body = {"prompt": "Count to one hundred:", "max_tokens": 40, "ignore_eos": True}

        def one(_):
            return httpx.post(s.url + C, json=body, timeout=120)

        with cf.ThreadPoolExecutor(8) as ex:
            rs = list(ex.map(one, range(8)))
        codes = sorted(r.status_code for r in rs)
        assert 200 in codes and 503 in codes, codes
        for r in rs:
            if r.status_code == 503:
                check_error(r, 503)
                assert r.headers.get("retry-after") == "1"
                assert r.json()["error"]["code"] == "server_overloaded"
                assert "--max-waiting" in r.json()["error"]["message"]
        after = s.metrics()["kvant_requests_queue_full_total"]
        assert after - before == codes.count(503)
        # and it recovers
        assert one(0).status_code == 200
    finally:
        assert s.stop() == 0, s.log_text()
