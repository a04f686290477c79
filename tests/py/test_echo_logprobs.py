"""`echo` with `logprobs` on /v1/completions, as lm-eval's local-completions loglikelihood tasks
use it (echo: true, max_tokens 0 or 1, logprobs N): the prompt leads the text, and its tokens
are in `logprobs` (tokens, token_logprobs with the first null, top_logprobs with the first
null, text_offset), as OpenAI's legacy completions and vLLM return them.

Reference: `kvant logits` (teacher-forced logits of the same token ids, a separate command
and code path: one sequence, no scheduler); the prompt tokens' log-probabilities from the
server must equal its log-softmax within 1e-3, and the top alternatives must be its largest.
The server runs with --max-num-seqs 8, so a 300-token prompt's log-probabilities come in
chunks of at most 8 logit rows per step, also while another request generates beside it."""
from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import tempfile

import httpx
import numpy as np
import openai
import pytest

from server_util import KvantServer, THREADS, module_openai_client, module_server

MODEL = "SmolLM2-135M-Instruct.Q4_1"
TOL = 1e-3
SHORT = "The capital of France is Paris, and the capital of Italy is"
LONG = ("In the beginning the sea was calm, and the sailors told stories of distant lands. " * 20)


srv = module_server("--max-num-seqs", "8")


client = module_openai_client(300)


def tokens(srv, text):
    return httpx.post(srv.url + "/tokenize", json={"prompt": text}, timeout=30).json()["tokens"]


def ref_logprobs(kvant_bin, model, ids):
    """log-softmax rows of `kvant logits` (float64): row j predicts ids[j + 1]."""
    with tempfile.TemporaryDirectory() as d:
        tf, of = os.path.join(d, "ids.txt"), os.path.join(d, "logits.f32")
        with open(tf, "w") as f:
            f.write(" ".join(map(str, ids)))
        subprocess.run([kvant_bin, "logits", "-m", model, "-t", THREADS, "--tokens-file", tf,
                        "--out", of], check=True, capture_output=True, timeout=300)
        x = np.fromfile(of, dtype=np.float32).astype(np.float64).reshape(len(ids), -1)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def piece(srv, i):
    return httpx.post(srv.url + "/detokenize", json={"tokens": [i]}, timeout=30).json()["prompt"]


def check_against_ref(srv, lp, ids, ref, k):
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    got = np.array(lp.token_logprobs[1:len(ids)], dtype=np.float64)
    want = ref[np.arange(len(ids) - 1), ids[1:]]
    err = np.abs(got - want).max()
    print(f"prompt logprobs vs kvant logits: {len(ids)} tokens, max abs diff {err:.2e}")
    assert err < TOL, f"prompt logprobs differ from kvant logits by {err:.2e}"
    for j in (1, len(ids) // 2, len(ids) - 1):  # the alternatives are the reference's best
        top = lp.top_logprobs[j]
        assert len(top) == k
        best = np.argsort(-ref[j - 1], kind="stable")[:k]
        assert sorted(top.values(), reverse=True) == pytest.approx(ref[j - 1][best], abs=TOL)


@pytest.mark.parametrize("text", [SHORT, LONG], ids=["short", "long-chunked"])
def test_echo_prompt_logprobs_match_kvant_logits(srv, client, kvant_bin, default_model, text):
    ids = tokens(srv, text)
    ref = ref_logprobs(kvant_bin, default_model, ids)
    r = client.completions.create(model=MODEL, prompt=text, echo=True, max_tokens=0,
                                  logprobs=3, temperature=0)
    c = r.choices[0]
    assert c.text == text and c.finish_reason == "length"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0
    lp = c.logprobs
    assert len(lp.tokens) == len(ids) == len(lp.token_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(len(ids))]
    check_against_ref(srv, lp, ids, ref, 3)


def test_echo_long_prompt_beside_a_generation(srv, client, kvant_bin, default_model):
    """Prompt logprobs in chunks while another request decodes: both unchanged."""
    ids = tokens(srv, LONG)
    ref = ref_logprobs(kvant_bin, default_model, ids)
    gen = dict(model=MODEL, prompt="Once upon a time", max_tokens=64, temperature=0)
    alone = client.completions.create(**gen).choices[0].text
    with cf.ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(client.completions.create, **gen) for _ in range(2)]
        echo = ex.submit(client.completions.create, model=MODEL, prompt=ids, echo=True,
                         max_tokens=1, logprobs=2, temperature=0)
        texts = [f.result().choices[0].text for f in futs]
        r = echo.result()
    assert texts == [alone, alone]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1  # the prompt, then the generated token
    check_against_ref(srv, lp, ids, ref, 2)
    # the generated token is the greedy one: the reference's argmax after the whole prompt
    assert lp.token_logprobs[-1] == pytest.approx(ref[-1].max(), abs=TOL)


def test_echo_with_generation_and_without_logprobs(client):
    plain = client.completions.create(model=MODEL, prompt=SHORT, max_tokens=6, temperature=0)
    r = client.completions.create(model=MODEL, prompt=SHORT, max_tokens=6, temperature=0,
                                  echo=True, n=2)
    assert [c.text for c in r.choices] == [SHORT + plain.choices[0].text] * 2
    assert all(c.logprobs is None for c in r.choices)
    assert r.usage.completion_tokens == 2 * plain.usage.completion_tokens


def test_echo_lists_and_streaming(srv, client):
    """lm-eval sends lists of token arrays; choices per prompt; streaming gives the same."""
    prompts = [tokens(srv, SHORT), tokens(srv, "Hello there, my friend")]
    r = client.completions.create(model=MODEL, prompt=prompts, echo=True, max_tokens=1,
                                  logprobs=1, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    for c, ids in zip(r.choices, prompts):
        assert len(c.logprobs.tokens) == len(ids) + 1
        assert c.logprobs.token_logprobs[0] is None
    text: dict[int, str] = {}
    lps: dict[int, list] = {}
    for ch in client.completions.create(model=MODEL, prompt=prompts, echo=True, max_tokens=1,
                                        logprobs=1, temperature=0, stream=True):
        for c in ch.choices:
            text[c.index] = text.get(c.index, "") + c.text
            if c.logprobs:
                lps.setdefault(c.index, []).extend(c.logprobs.token_logprobs)
    for c in r.choices:
        assert text[c.index] == c.text
        assert lps[c.index][0] is None
        assert np.allclose(lps[c.index][1:], c.logprobs.token_logprobs[1:], atol=1e-6)


def test_echo_refusals(client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=MODEL, prompt=SHORT, max_tokens=0)
    assert ei.value.body["param"] == "max_tokens"


def test_echo_stream_not_cut_by_the_backlog_bound(kvant_bin, default_model):
    """A long prompt's logprob events arrive in bursts of up to 64 rows per step; with
    --stream-backlog 16 they must not count as a client falling behind."""
    s = KvantServer(kvant_bin, default_model, "--stream-backlog", "16")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        ids = tokens(s, LONG)
        n_lp, finish = 0, None
        for ch in c.completions.create(model=MODEL, prompt=ids, echo=True, max_tokens=4,
                                       logprobs=1, temperature=0, stream=True):
            for x in ch.choices:
                n_lp += len(x.logprobs.tokens) if x.logprobs else 0
                finish = x.finish_reason or finish
        assert finish == "length" and n_lp == len(ids) + 4
    finally:
        assert s.stop() == 0, s.log_text()
