"""Speculative decoding with a draft model (`kvant serve --draft-model PATH`).

The default model drafts for a 0.4B target of its vocabulary: bench/spec_target.py zero-pads it
to embedding 1024, 16 query and 4 KV heads and FFN 3072, in Q8_0 (the same function up to
rounding, three times the cost: most drafts are accepted, some are not).  Whether drafting pays
depends on the machine (on a Zen 1 core a verify pass's extra tokens cost so much that the cost
model stops drafting after a few steps), so the server is the test build with the cost model
told never to decline (KVANT_TEST_SPEC_UNJUDGED, build/kvant-testhooks): what is checked is the
output and the counts, not the cost model's choice.  The reference is the same server with the
request opted out (`"speculative": false`).  Greedy requests with the draft give
exactly the reference's text and token log-probabilities, alone and four at once, and report
drafted and accepted tokens (both outcomes occur), counted in /metrics too.  The draft's weights
and KV are in the one budget: /v1/memory and /metrics show draft_weights and draft_kv of the
sizes `kvant plan --draft-model --json` prints, and the plan takes them out of the budget
(`reserved_bytes`).
A JSON-schema request gives the same valid output with the draft.  `kvant run --draft-model`
gives the tokens it gives without it.  A draft of another vocabulary
is refused at start naming the token, and `--spec draft` without a draft model is a usage
error.
"""
from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from server_util import KvantServer

ROOT = Path(__file__).resolve().parent.parent.parent
MODEL = "target-0.4b.q8_0"
PROMPTS = ["Write a short story about a lighthouse keeper.",
           "List five facts about the Moon, one per line.",
           "Explain what a hash table is to a beginner.",
           "Repeat exactly: the quick brown fox jumps over the lazy dog, twice."]


@pytest.fixture(scope="module")
def target(default_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("spec_target") / f"{MODEL}.gguf"
    spec = importlib.util.spec_from_file_location("spec_target", ROOT / "bench" / "spec_target.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--src", default_model, "--out", str(out), "--shape", "1024,16,4,3072"]) == 0
    return str(out)


@pytest.fixture(scope="module")
def draft(default_model):
    return default_model


@pytest.fixture(scope="module")
def srv(testhooks_bin, target, draft):
    s = KvantServer(testhooks_bin, target, "-c", "2048", "--draft-model", draft,
                    env={**os.environ, "KVANT_TEST_SPEC_UNJUDGED": "1"})
    yield s
    assert s.stop() == 0, s.log_text()


def chat(url: str, content: str, spec: bool, **kw) -> dict:
    body = {"model": MODEL, "max_tokens": 64, "temperature": 0, "logprobs": True,
            "speculative": spec, "messages": [{"role": "user", "content": content}], **kw}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def lp(resp: dict) -> list:
    return [(t["token"], t["logprob"]) for t in resp["choices"][0]["logprobs"]["content"]]


def test_same_output_and_counts(srv):
    before = srv.metrics()
    drafted = accepted = 0
    for t in PROMPTS:
        ref, got = chat(srv.url, t, False), chat(srv.url, t, True)
        assert got["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
        assert lp(got) == lp(ref)
        assert ref["usage"]["draft_tokens"] == 0
        drafted += got["usage"]["draft_tokens"]
        accepted += got["usage"]["accepted_tokens"]
    assert 0 < accepted < drafted, (drafted, accepted)
    assert accepted >= drafted // 2, (drafted, accepted)  # the target's near twin
    after = srv.metrics()
    assert after["kvant_spec_draft_tokens_total"] - before["kvant_spec_draft_tokens_total"] \
        == drafted
    assert after["kvant_spec_accepted_tokens_total"] - \
        before["kvant_spec_accepted_tokens_total"] == accepted


def test_concurrent(srv):
    refs = [chat(srv.url, t, False) for t in PROMPTS]
    with cf.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda t: chat(srv.url, t, True), PROMPTS))
    for r, g in zip(refs, got):
        assert g["choices"][0]["message"]["content"] == r["choices"][0]["message"]["content"]
        assert lp(g) == lp(r)


def test_structured(srv):
    """A JSON schema with the draft model: each drafted position is masked by the grammar
    state after the accepted tokens, so the output is the one without speculation (valid).
    The draft proposes without the grammar, so here it drafts prose and the mask rejects it
    (the acceptance rate then pauses drafting): drafts are made, few or none accepted."""
    import jsonschema
    schema = {"type": "object", "properties": {
        "items": {"type": "array", "maxItems": 4, "items": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                             "price": {"type": "integer"}},
            "required": ["name", "price"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False}
    content = "List these as JSON items with name and price: apple 3, pear 4, plum 5, fig 6."
    rf = {"type": "json_schema", "json_schema": {"name": "items", "schema": schema}}
    ref = chat(srv.url, content, False, response_format=rf, max_tokens=96)
    got = chat(srv.url, content, True, response_format=rf, max_tokens=96)
    text = got["choices"][0]["message"]["content"]
    assert text == ref["choices"][0]["message"]["content"]
    assert lp(got) == lp(ref)
    if got["choices"][0]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(text), schema)
    assert got["usage"]["draft_tokens"] > 0, got["usage"]


def test_memory_is_the_plan(srv, kvant_bin, target, draft):
    p = subprocess.run([kvant_bin, "plan", "-m", target, "-c", "2048", "--draft-model",
                        draft, "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    d = plan["draft"]
    assert d["weights_bytes"] > 0 and d["kv_bytes"] > 0 and d["kv_sequences"] == 4
    assert d["ctx"] == 2048 and d["kv_tokens"] >= 4 * 2048
    mem = httpx.get(srv.url + "/v1/memory", timeout=10).json()
    cats = mem["categories"]
    assert cats["draft_weights"]["current"] == d["weights_bytes"]
    assert cats["draft_kv"]["current"] == d["kv_bytes"]
    assert plan["plans"][0]["plan"]["reserved_bytes"] == d["bytes"]
    m = srv.metrics()
    assert m["kvant_device_memory_bytes{category=draft_weights}"] == d["weights_bytes"]
    assert m["kvant_device_memory_bytes{category=draft_kv}"] == d["kv_bytes"]
    assert mem["used"] <= mem["budget"]


def test_other_vocabulary_refused(kvant_bin, default_model, synthetic_dir):
    import make_synthetic
    other = make_synthetic.make_model(synthetic_dir, "llama-F16")
    p = subprocess.run([kvant_bin, "bench", "-m", default_model, "--batch", "1", "-p", "8",
                        "-n", "4", "--draft-model", other], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0
    assert "vocabulary" in p.stderr and "draft" in p.stderr, p.stderr
    p = subprocess.run([kvant_bin, "plan", "-m", default_model, "--draft-model", other],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "vocabulary" in p.stderr, p.stderr


def test_usage_errors(kvant_bin, default_model):
    for bad in (["--spec", "draft"], ["--spec", "ngram", "--draft-model", default_model]):
        p = subprocess.run([kvant_bin, "serve", "-m", default_model, *bad], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2, (bad, p.stderr)
        assert "--draft-model" in p.stderr or "--spec" in p.stderr, p.stderr
    p = subprocess.run([kvant_bin, "run", "-m", default_model, "-p", "hi", "--spec", "draft"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--draft-model" in p.stderr, p.stderr


def test_run_cli(kvant_bin, target, draft, synthetic_dir):
    """kvant run --draft-model: the same tokens as without it, with drafts made and accepted."""
    out = {}
    for spec in ([], ["--draft-model", draft]):
        p = subprocess.run([kvant_bin, "run", "-m", target, "-p", PROMPTS[0], "--chat", "-n", "48",
                            "--temp", "0", "--json", *spec], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr
        out[bool(spec)] = json.loads(p.stdout)
    assert out[True]["token_ids"] == out[False]["token_ids"]
    assert out[True]["text"] == out[False]["text"]
    assert out[False]["draft_tokens"] == 0
    assert 0 < out[True]["accepted_tokens"] <= out[True]["draft_tokens"], out[True]
    import make_synthetic
    other = make_synthetic.make_model(synthetic_dir, "llama-F16")
    p = subprocess.run([kvant_bin, "run", "-m", target, "-p", "hi", "--draft-model", other],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "vocabulary" in p.stderr, p.stderr
