#!/usr/bin/env python3
"""KV budget (kv_budget; the sinks and snapkv policies): quality and memory, through `kvant serve`.

One server (-c 8192, the default model), one request per measurement, the budget in the request:
  * perplexity: the text (tests/data/english-eval.txt) tokenized once, cut into chunks of CTX - 1
    tokens (CTX 4096, 8192: the chunk and the one generated token fill the context); each chunk is
    one completion request with echo and logprobs, and the predictions made at positions CTX/2 ..
    CTX-3 are scored (llama-perplexity's convention, one position short), for the
    full cache and budgets of 50%, 25% and 12.5% of CTX.  The request's usage.kv_bytes is its KV
    footprint when it ends (block tables: what /v1/memory counts).
  * passkey: a five-digit number hidden at depths 10%..90% of filler text (CTX_PASS tokens),
    followed by the question; greedy, 8 tokens; correct when the number appears in the answer;
    per policy (--policies).  Streamed: /v1/memory's requests are read after the first token
    (kv_bytes_decoding; a snapkv request holds its whole prompt until then, usage.kv_bytes).
    Perplexity is the sinks policy's: snapkv computes a prompt with the whole cache.
  * concurrency (--load): a pool of exactly 4 x 8192 tokens (--kv-blocks), 16 requests of about
    7,600 prompt tokens + 32 generated sent at once, full cache against a 25% budget: the most
    requests running at once (kvant_num_requests_running, polled) and the wall time.

usage: bench/kv_budget.py [-m MODEL] [--ctx 4096,8192] [--load] [--json OUT]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import random
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests/py"))
from server_util import KvantServer  # noqa: E402

TEXT = ROOT / "tests/data/english-eval.txt"
FRACS = [None, 0.5, 0.25, 0.125]
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
          "again. ")


def tokenize(url: str, text: str) -> list[int]:
    r = httpx.post(url + "/tokenize", json={"prompt": text, "add_special_tokens": False},
                   timeout=120)
    r.raise_for_status()
    return r.json()["tokens"]


def score_chunk(url: str, ids: list[int], budget: int | None) -> tuple[float, int, int]:
    body = dict(prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=0)
    if budget:
        body["kv_budget"] = budget
    r = httpx.post(url + "/v1/completions", json=body, timeout=3600)
    r.raise_for_status()
    j = r.json()
    lp = j["choices"][0]["logprobs"]["token_logprobs"]
    n = len(ids)
    # token_logprobs[k] = log p(ids[k] | ids[:k]): the predictions made at (n + 1) / 2 .. n - 2
    lo = (n + 1) // 2 + 1
    nll = -sum(lp[k] for k in range(lo, n))
    return nll, n - lo, j["usage"]["kv_bytes"]


def perplexity(url: str, toks: list[int], ctx: int, frac: float | None) -> dict:
    budget = int(ctx * frac) if frac else None
    tot, cnt, kvb, t0 = 0.0, 0, [], time.time()
    n = ctx - 1
    for c in range(len(toks) // n):
        nll, k, kv = score_chunk(url, toks[c * n:(c + 1) * n], budget)
        tot, cnt = tot + nll, cnt + k
        kvb.append(kv)
    return {"ctx": ctx, "budget": budget, "ppl": math.exp(tot / cnt), "scored": cnt,
            "kv_bytes": max(kvb), "seconds": time.time() - t0}


def passkey_prompts(url: str, n_tok: int, depths: list[float], keys: list[int]) -> list[dict]:
    unit = len(tokenize(url, FILLER))
    n_fill = max(1, (n_tok - 80) // unit)
    out = []
    for key in keys:
        for d in depths:
            at = int(n_fill * d)
            text = ("There is important info hidden inside a lot of irrelevant text. Find it and "
                    "memorize it.\n" + FILLER * at +
                    f"The pass key is {key}. Remember it. {key} is the pass key. " +
                    FILLER * (n_fill - at) + "\nWhat is the pass key? The pass key is")
            out.append({"key": key, "depth": d, "prompt": text})
    return out


def passkey(url: str, prompts: list[dict], budget: int | None, policy: str) -> dict:
    """Streamed, so /v1/memory is read while the request decodes (after its first token: a
    snapkv request is compacted by then); kv_bytes: usage (the footprint at its largest)."""
    ok, kvb, held = 0, [], []
    for p in prompts:
        body = dict(prompt=p["prompt"], max_tokens=8, temperature=0, stream=True,
                    stream_options={"include_usage": True})
        if budget:
            body.update(kv_budget=budget, kv_policy=policy)
        text, sampled = "", False
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=3600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                j = json.loads(line[6:])
                if j.get("choices"):
                    if not sampled:
                        reqs = httpx.get(url + "/v1/memory", timeout=60).json()["requests"]
                        held.append(sum(q["kv_bytes"] for q in reqs))
                        sampled = True
                    text += j["choices"][0].get("text", "")
                if j.get("usage"):
                    kvb.append(j["usage"]["kv_bytes"])
        ok += str(p["key"]) in text
    return {"budget": budget, "policy": policy if budget else "full", "correct": ok,
            "n": len(prompts), "kv_bytes": max(kvb), "kv_bytes_decoding": max(held)}


def running(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("kvant_num_requests_running "):
            return float(line.split()[1])
    return 0.0


def load(kvant: str, model: str, threads: str, toks: list[int], budget: int | None) -> dict:
    srv = KvantServer(kvant, model, "-t", threads, "-c", "8192", "--kv-blocks", str(4 * 8192 // 16),
                      "--max-num-seqs", "64", "--no-prefix-cache", base_args=[])
    try:
        n_req, plen = 16, 7600
        prompts = [toks[(i * 997) % (len(toks) - plen):][:plen] for i in range(n_req)]
        peak, stop = [0.0], threading.Event()

        def poll():
            while not stop.is_set():
                peak[0] = max(peak[0], running(srv.url))
                time.sleep(0.2)

        th = threading.Thread(target=poll)
        th.start()
        t0 = time.time()

        def one(p):
            body = dict(prompt=p, max_tokens=32, temperature=0, ignore_eos=True)
            if budget:
                body["kv_budget"] = budget
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=7200)
            r.raise_for_status()
            return r.json()["usage"]["kv_bytes"]

        with cf.ThreadPoolExecutor(n_req) as ex:
            kvb = list(ex.map(one, prompts))
        wall = time.time() - t0
        stop.set()
        th.join()
    finally:
        srv.stop()
    return {"budget": budget, "requests": n_req, "prompt_tokens": plen, "peak_running": peak[0],
            "seconds": wall, "kv_bytes_max": max(kvb)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--kvant", default=str(ROOT / "build/kvant"))
    ap.add_argument("--threads", default="2")
    ap.add_argument("--ctx", default="4096,8192")
    ap.add_argument("--pass-ctx", type=int, default=4096)
    ap.add_argument("--no-ppl", action="store_true")
    ap.add_argument("--no-passkey", action="store_true")
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--policies", default="sinks,snapkv", help="passkey: the policies measured")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    res = {"model": a.model, "ppl": [], "passkey": [], "load": []}
    srv = KvantServer(a.kvant, a.model, "-t", a.threads, "-c", "8192", "--max-num-seqs", "256",
                      base_args=[])
    try:
        toks = tokenize(srv.url, TEXT.read_text())
        res["text_tokens"] = len(toks)
        if not a.no_ppl:
            for ctx in map(int, a.ctx.split(",")):
                for f in FRACS:
                    row = perplexity(srv.url, toks, ctx, f)
                    res["ppl"].append(row)
                    print(json.dumps(row), flush=True)
        if not a.no_passkey:
            prompts = passkey_prompts(srv.url, a.pass_ctx, [0.1, 0.3, 0.5, 0.7, 0.9],
                                      [random.Random(s).randint(10000, 99999) for s in (1, 2)])
            for f in FRACS:
                for pol in a.policies.split(",") if f else ["full"]:
                    row = passkey(srv.url, prompts, int(a.pass_ctx * f) if f else None, pol)
                    row["ctx"] = a.pass_ctx
                    res["passkey"].append(row)
                    print(json.dumps(row), flush=True)
    finally:
        srv.stop()
    if a.load:
        for b in (None, 2048):
            row = load(a.kvant, a.model, a.threads, toks, b)
            res["load"].append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
