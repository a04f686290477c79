"""Speculative decoding by prompt lookup (`kvant serve --spec ngram`) on the default model.

The reference is the same server with the request opted out (`"speculative": false`): the
engine then decodes one token per step.  Greedy requests with speculation give exactly the
reference's text, token log-probabilities and top alternatives, alone, four at once, streamed,
and cut by a stop string at the same place; usage reports drafted and accepted tokens (both
outcomes occur), and /metrics counts the same totals; a sampled request drafts and accepts too
(speculative sampling).  A server without --spec reports no
draft counts; a bad value of the field or of --spec is refused, naming it.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import subprocess
from pathlib import Path

import httpx
import pytest

from server_util import KvantServer, module_server

ROOT = Path(__file__).resolve().parent.parent.parent
MODEL = "SmolLM2-135M-Instruct.Q4_1"
CODE = '''def total_price(items, tax):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    return subtotal * (1 + tax)


def cheapest(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best
'''

srv = module_server("--spec", "ngram")


def texts() -> list[str]:
    para = (ROOT / "tests" / "data" / "english.txt").read_text().split("\n\n")
    paras = [p.strip() for p in para if len(p.strip()) > 300][:2]
    return ["Rename the function total_price to order_total in this code and show the whole "
            "code:\n\n" + CODE,
            *["Repeat the following text exactly:\n\n" + p[:900] for p in paras]]


def chat(url: str, content: str, spec: bool, **kw) -> dict:
    body = {"model": MODEL, "max_tokens": 96, "temperature": 0, "logprobs": True,
            "top_logprobs": 3, "speculative": spec,
            "messages": [{"role": "user", "content": content}], **kw}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def lp(resp: dict) -> list:
    return [(t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
            for t in resp["choices"][0]["logprobs"]["content"]]


def test_same_output_and_counts(srv):
    before = srv.metrics()
    drafted = accepted = 0
    for t in texts():
        ref, got = chat(srv.url, t, False), chat(srv.url, t, True)
        assert got["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
        assert lp(got) == lp(ref)
        assert got["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
        assert ref["usage"]["draft_tokens"] == 0 and ref["usage"]["accepted_tokens"] == 0
        drafted += got["usage"]["draft_tokens"]
        accepted += got["usage"]["accepted_tokens"]
    assert 0 < accepted < drafted, (drafted, accepted)
    after = srv.metrics()
    assert after["kvant_spec_draft_tokens_total"] - before["kvant_spec_draft_tokens_total"] \
        == drafted
    assert after["kvant_spec_accepted_tokens_total"] - \
        before["kvant_spec_accepted_tokens_total"] == accepted
    assert after["kvant_spec_acceptance_ratio_count"] > before["kvant_spec_acceptance_ratio_count"]


def test_concurrent(srv):
    ts = texts()
    refs = [chat(srv.url, t, False) for t in ts]
    with cf.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda t: chat(srv.url, t, True), ts + ts[:1]))
    for r, g in zip(refs + refs[:1], got):
        assert g["choices"][0]["message"]["content"] == r["choices"][0]["message"]["content"]
        assert lp(g) == lp(r)


def test_stream_and_stop(srv):
    t = texts()[0]
    ref = chat(srv.url, t, False)["choices"][0]["message"]["content"]
    body = {"model": MODEL, "max_tokens": 96, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": t}]}
    parts = []
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    parts.append(c["delta"].get("content") or "")
    assert "".join(parts) == ref
    stop = ref[len(ref) // 2:len(ref) // 2 + 6]
    assert stop.strip(), ref
    cut = chat(srv.url, t, True, stop=[stop])
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["message"]["content"] == ref[:ref.index(stop)]


def test_sampled(srv):
    """Speculative sampling drafts and accepts on text the prompt holds (its distribution is
    tests/unit/test_sampler.c's chi-square test)."""
    t = texts()[0]
    r = chat(srv.url, t, True, temperature=0.3, seed=11)
    assert r["usage"]["accepted_tokens"] > 0, r["usage"]
    assert r["usage"]["completion_tokens"] > 0


def test_structured(srv):
    """A JSON schema with speculation: the same (valid) output as without it, drafts accepted."""
    import jsonschema
    schema = {"type": "object", "properties": {
        "items": {"type": "array", "maxItems": 6, "items": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                             "price": {"type": "integer"}},
            "required": ["name", "price"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False}
    content = ("List these as JSON items with name and price: apple 3, pear 4, plum 5, "
               "fig 6, kiwi 7, lime 8.")
    rf = {"type": "json_schema", "json_schema": {"name": "items", "schema": schema}}
    ref = chat(srv.url, content, False, response_format=rf, max_tokens=160)
    got = chat(srv.url, content, True, response_format=rf, max_tokens=160)
    text = got["choices"][0]["message"]["content"]
    assert text == ref["choices"][0]["message"]["content"]
    assert lp(got) == lp(ref)
    if got["choices"][0]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(text), schema)
    assert got["usage"]["accepted_tokens"] > 0, got["usage"]


def test_bad_field(srv):
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "max_tokens": 4, "speculative": "yes",
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "speculative" in r.text


def test_without_spec(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model)
    try:
        u = chat(s.url, "Say hello.", True)["usage"]
        assert "draft_tokens" not in u
    finally:
        assert s.stop() == 0, s.log_text()
    for bad in (["--spec", "draft"], ["--spec-draft", "99"],
                ["--spec", "ngram", "--spec-ngram-min", "5", "--spec-ngram-max", "3"]):
        p = subprocess.run([kvant_bin, "serve", "-m", default_model, *bad], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2, (bad, p.stderr)
        assert "--spec" in p.stderr, p.stderr


def test_run_cli(kvant_bin, default_model):
    """`kvant run --spec ngram`: the same tokens as without it, drafts accepted."""
    para = texts()[1].split("\n\n", 1)[1]
    prompt = para + "\n\n" + " ".join(para.split()[:12])
    out = {}
    for spec in ("off", "ngram"):
        p = subprocess.run([kvant_bin, "run", "-m", default_model, "-p", prompt, "-n", "64",
                            "--json", "--spec", spec], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr
        out[spec] = json.loads(p.stdout)
    assert out["ngram"]["token_ids"] == out["off"]["token_ids"]
    assert out["off"]["draft_tokens"] == 0
    assert 0 < out["ngram"]["accepted_tokens"] <= out["ngram"]["draft_tokens"]
