"""`prompt` as a list on /v1/completions: strings, token-id arrays, or one token-id array.
One engine request per prompt; choice index = prompt_index * n + i (as OpenAI); usage summed;
streaming chunks carry the same indexes.  Every choice must equal the same prompt sent alone
(greedy, batch-invariant engine)."""
from __future__ import annotations

import httpx
import openai
import pytest

from server_util import module_openai_client, module_server

MODEL = "SmolLM2-135M-Instruct.Q4_1"
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]


srv = module_server()


client = module_openai_client()


def alone(client, prompt, **kw):
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, **kw)
    assert len(r.choices) == 1
    return r.choices[0].text, r.usage


def tokens(srv, text):
    return httpx.post(srv.url + "/tokenize", json={"prompt": text}, timeout=30).json()["tokens"]


@pytest.mark.parametrize("as_ids", [False, True], ids=["strings", "token-arrays"])
def test_list_one_request_per_prompt(srv, client, as_ids):
    want = [alone(client, p) for p in PROMPTS]
    prompt = [tokens(srv, p) for p in PROMPTS] if as_ids else PROMPTS
    n = 2
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, n=n)
    assert [c.index for c in r.choices] == list(range(len(PROMPTS) * n))
    for c in r.choices:
        assert c.text == want[c.index // n][0], (c.index, c.text)
        assert c.finish_reason == "length"
    assert r.usage.prompt_tokens == sum(u.prompt_tokens for _, u in want)
    assert r.usage.completion_tokens == n * sum(u.completion_tokens for _, u in want)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_single_token_array_and_list_of_one(srv, client):
    text, _ = alone(client, PROMPTS[0])
    ids = tokens(srv, PROMPTS[0])
    for prompt in (ids, [ids], [PROMPTS[0]]):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        assert [c.index for c in r.choices] == [0] and r.choices[0].text == text


def test_list_streaming(srv, client):
    want = [alone(client, p)[0] for p in PROMPTS]
    n = 2
    got: dict[int, str] = {}
    finish: dict[int, str] = {}
    usage = None
    for ch in client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=8,
                                        temperature=0, n=n, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            got[c.index] = got.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert sorted(got) == list(range(len(PROMPTS) * n))
    for i, t in got.items():
        assert t == want[i // n], (i, t)
    assert sorted(finish) == sorted(got)
    assert usage is not None and usage.completion_tokens == 8 * n * len(PROMPTS)


def test_list_bound_and_logprobs(srv, client):
    r = client.completions.create(model=MODEL, prompt=["Hi"] * 128, max_tokens=1, temperature=0,
                                  logprobs=2)
    assert len(r.choices) == 128
    assert all(len(c.logprobs.tokens) == 1 for c in r.choices)
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=MODEL, prompt=["Hi"] * 129, max_tokens=1)
    assert ei.value.body["param"] == "prompt" and "128" in ei.value.body["message"]


def test_list_one_prompt_stopped_early(client):
    """A prompt whose choices all hit a stop string is cancelled alone; the others go on."""
    prompts = [PROMPTS[2], PROMPTS[1]]
    want = [alone(client, p, stop=[" 6"]) for p in prompts]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=8, temperature=0,
                                  stop=[" 6"])
    assert [c.text for c in r.choices] == [w[0] for w in want]
    assert [c.finish_reason for c in r.choices] == ["stop", "length"], r.choices
