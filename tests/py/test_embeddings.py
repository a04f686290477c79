"""POST /v1/embeddings through the official openai client: the final hidden state after the
output norm, mean-pooled (or the last token's, --embedding-pooling last), L2-normalised.

* The default model: shapes, unit norms, base64 == float, the same text gives the same vector
  alone and in a batch (batch invariance: bitwise), token-array inputs, refusals, and
  generation beside embeddings unchanged.
* A synthetic llama F32 model served with --exact and f32 K/V: the vectors equal the float64
  numpy reference (ref_model.py's forward, its hidden state after output_norm) within 1e-5
  (cosine distance) and 1e-4 per element, for both poolings, rows chunked by the logit rows
  (--max-num-seqs 8)."""
from __future__ import annotations

import base64
import concurrent.futures as cf

import numpy as np
import openai
import pytest

import make_synthetic as ms
from ref_model import RefModel
from server_util import KvantServer, THREADS, module_openai_client, module_server

MODEL = "SmolLM2-135M-Instruct.Q4_1"
TEXTS = ["The sea was calm that night.", "Paris is the capital of France.", "1, 2, 3"]


srv = module_server()


client = module_openai_client()


def vecs(r):
    return np.array([d.embedding for d in r.data], dtype=np.float64)


def test_shapes_norms_and_batch_invariance(client):
    r = client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in r.data] == [0, 1, 2]
    v = vecs(r)
    assert v.shape == (3, 576)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens
    for i, t in enumerate(TEXTS):
        alone = vecs(client.embeddings.create(model=MODEL, input=t))[0]
        assert np.array_equal(alone, v[i]), f"text {i}: alone differs from in a batch"
    # different texts, different vectors
    assert abs(float(v[0] @ v[1])) < 0.9999


def test_base64_equals_float(client):
    f = client.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="float")
    b = client.embeddings.with_raw_response.create(model=MODEL, input=TEXTS[:2],
                                                   encoding_format="base64")
    raw = b.http_response.json()
    for d, want in zip(raw["data"], f.data):
        got = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
        assert np.array_equal(got, np.array(want.embedding, dtype=np.float32))


def test_token_arrays_and_refusals(srv, client):
    import httpx
    ids = httpx.post(srv.url + "/tokenize", json={"prompt": TEXTS[0]}, timeout=30).json()["tokens"]
    a = vecs(client.embeddings.create(model=MODEL, input=TEXTS[0]))[0]
    assert np.array_equal(vecs(client.embeddings.create(model=MODEL, input=ids))[0], a)
    assert np.array_equal(vecs(client.embeddings.create(model=MODEL, input=[ids, ids]))[1], a)
    for kw, param in [({"dimensions": 64}, "dimensions"), ({"input": []}, "input"),
                      ({"input": ["a", [1]]}, "input"), ({"input": [[10 ** 9]]}, "input"),
                      ({"extra_body": {"bogus": 1}}, "bogus")]:
        kw = {"input": "x", **kw}
        with pytest.raises(openai.BadRequestError) as ei:
            client.embeddings.create(model=MODEL, **kw)
        assert ei.value.body["param"] == param, (kw, ei.value.body)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")


def test_departed_client_cancelled_at_once(srv):
    """A client that closes its connection while its 512 short inputs are waiting and running: every
    one is cancelled (the HTTP thread polls an eventfd with the socket, no timed wait), so
    running + waiting reach 0 within an engine step or two (3 s allowed: a step of this batch
    takes ~0.7 s on the loaded 2-core machine, and the whole request ~60 s), most inputs never
    computed, and the KV blocks are back."""
    import json
    import socket
    import time

    import httpx
    before = srv.metrics()
    body = json.dumps({"model": MODEL, "input": [f"{TEXTS[0]} {i}" for i in range(512)]})
    sk = socket.create_connection(("127.0.0.1", srv.port))
    sk.sendall((f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    deadline = time.time() + 30
    while srv.metrics()["kvant_num_requests_running"] == 0 and time.time() < deadline:
        time.sleep(0.02)
    m = srv.metrics()
    assert m["kvant_num_requests_running"] + m["kvant_num_requests_waiting"] > 0, m
    sk.close()
    t0 = time.time()
    while True:
        m = srv.metrics()
        if m["kvant_num_requests_running"] + m["kvant_num_requests_waiting"] == 0:
            break
        assert time.time() - t0 < 3.0, m
        time.sleep(0.02)
    m = srv.wait_idle(before["kvant_kv_blocks_used"], timeout=5)
    assert m["kvant_kv_blocks_used"] == before["kvant_kv_blocks_used"]
    key = "kvant_prompt_tokens_computed_total"
    computed = m[key] - before[key]
    assert computed < 5000 / 2, computed  # the 512 inputs are ~5,500 tokens
    r = httpx.post(srv.url + "/v1/embeddings", json={"model": MODEL, "input": TEXTS[0]},
                   timeout=60)
    assert r.status_code == 200 and len(r.json()["data"]) == 1


def test_generation_beside_embeddings_unchanged(client):
    gen = dict(model=MODEL, prompt="Once upon a time", max_tokens=32, temperature=0)
    alone = client.completions.create(**gen).choices[0].text
    with cf.ThreadPoolExecutor(4) as ex:
        g = [ex.submit(client.completions.create, **gen) for _ in range(2)]
        e = [ex.submit(client.embeddings.create, model=MODEL, input=TEXTS) for _ in range(3)]
        assert [f.result().choices[0].text for f in g] == [alone, alone]
        want = vecs(client.embeddings.create(model=MODEL, input=TEXTS))
        for f in e:
            assert np.array_equal(vecs(f.result()), want)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_matches_float64_reference(kvant_bin, synthetic_dir, pooling):
    path = ms.make_model(synthetic_dir, "llama-F32")
    # --max-num-seqs 8: a 40-token prompt's rows come in chunks of the 8 logit rows
    s = KvantServer(kvant_bin, path, "--embedding-pooling", pooling, "--exact", "--kv-dtype",
                    "f32", "--max-num-seqs", "8",
                    base_args=["-t", THREADS, "-c", "256", "--kv-blocks", "64"])
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        rng = np.random.default_rng(7)
        inputs = [rng.integers(0, ms.N_VOCAB, size=n).tolist() for n in (1, 5, 40)]
        got = vecs(c.embeddings.create(model="llama-F32", input=inputs))
    finally:
        assert s.stop() == 0, s.log_text()
    ref = RefModel(path)
    captured = {}
    norm = ref.rmsnorm

    def capture(x, wname):
        y = norm(x, wname)
        if wname == "output_norm.weight":
            captured["h"] = y
        return y

    ref.rmsnorm = capture
    for ids, g in zip(inputs, got):
        ref.forward(ids)
        h = captured["h"]
        want = h.mean(axis=0) if pooling == "mean" else h[-1]
        want = want / np.linalg.norm(want)
        dist = 1.0 - float(g @ want)
        print(f"{pooling} pooling, {len(ids)} tokens: cosine distance to the reference {dist:.2e}, "
              f"max abs diff {np.abs(g - want).max():.2e}")
        assert dist < 1e-5 and np.abs(g - want).max() < 1e-4
