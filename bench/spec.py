#!/usr/bin/env python3
"""Speculative decoding: single-stream decode speed with and without it.

One `kvant serve --spec ngram` (2 threads), or with --draft-model D `kvant serve
--draft-model D` (a draft model drafts instead of prompt lookup); each workload's greedy chat request is sent with
`"speculative": false` (one token per step) and with speculation, in alternating rounds.
Decode tok/s = completion tokens after the first / (time of the last token - time of the
first), from the stream, so prefill is left out; medians over --rounds.  The outputs are
checked equal (greedy: speculation never changes them).

Workloads (the prompt holds most of the answer, or none of it):
  edit       chat: a 14-line Python snippet, "rename total_price to order_total in this
             code and show the whole code"
  copy       completion: the first long paragraph of tests/data/english.txt (900
             characters), a blank line, then its first 12 words again: the model goes on
             copying it (a document re-quoted, as in an edit or a summary that quotes)
  summarise  chat: "summarise this text, quoting its key sentences" on the second paragraph
  free       chat: "write a short story about a lighthouse keeper" (nothing to look up)

With --llama-server BIN, llama.cpp's server runs the same requests in the same rounds, one
instance without speculation and one with `--spec-type TYPE` (default ngram-simple, its
prompt-lookup drafter), or with --draft-model `--spec-type draft-simple -md D` (its draft
model; --llama-draft-max N sets --spec-draft-n-max, default its own 3), both -t THREADS
-c 4096 on the same file.

usage: bench/spec.py [--model M] [--draft-model D] [--rounds 5] [--max-tokens 160]
                     [--threads 2] [--llama-server BIN [--llama-spec-type T]] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
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


def workloads() -> dict[str, str]:
    paras = [p.strip() for p in (ROOT / "tests/data/english.txt").read_text().split("\n\n")
             if len(p.strip()) > 300]
    p0 = paras[0][:900]
    return {
        "edit": "Rename the function total_price to order_total in this code and show the "
                "whole code:\n\n" + CODE,
        "copy": {"prompt": p0 + "\n\n" + " ".join(p0.split()[:12])},
        "summarise": "Summarise this text, quoting its key sentences:\n\n" + paras[1][:900],
        "free": "Write a short story about a lighthouse keeper.",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(url: str, name: str, content, spec: bool, max_tokens: int) -> dict:
    """content: a chat message (str), or a completion body's fields (dict)."""
    body = {"model": name, "max_tokens": max_tokens, "temperature": 0, "speculative": spec,
            "stream": True, "stream_options": {"include_usage": True}}
    if isinstance(content, dict):
        body.update(content)
        route = "/v1/completions"
    else:
        body["messages"] = [{"role": "user", "content": content}]
        route = "/v1/chat/completions"
    times, text, usage = [], [], None
    with httpx.stream("POST", url + route, json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                piece = c["delta"].get("content") if "delta" in c else c.get("text")
                if piece:
                    times.append(time.perf_counter())
                    text.append(piece)
    n = usage["completion_tokens"] if usage else len(times)
    usage = usage or {}
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    return {"text": "".join(text), "tokens": n, "tps": (n - 1) / span if span > 0 else None,
            "drafted": usage.get("draft_tokens", 0), "accepted": usage.get("accepted_tokens", 0)}


def start(cmd: list[str], url: str) -> subprocess.Popen:
    log = tempfile.NamedTemporaryFile(prefix="spec-bench-", suffix=".log", delete=False)
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(900):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        if p.poll() is not None:
            sys.exit(f"{cmd[0]} exited {p.returncode}; log {log.name}")
        time.sleep(0.1)
    sys.exit(f"{cmd[0]} not healthy; log {log.name}")


def summary(base: list, spec: list, last: dict, same: bool) -> dict:
    return {"base_tps": statistics.median(base), "spec_tps": statistics.median(spec),
            "ratio": statistics.median(spec) / statistics.median(base), "tokens": last["tokens"],
            "drafted": last["drafted"], "accepted": last["accepted"],
            "acceptance": last["accepted"] / last["drafted"] if last["drafted"] else None,
            "same_output": same, "base_all": base, "spec_all": spec}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--kvant", default="build/kvant")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary (0c1e570)")
    ap.add_argument("--llama-spec-type", default="ngram-simple")
    ap.add_argument("--draft-model", help="a draft model of the same vocabulary (--spec draft)")
    ap.add_argument("--llama-draft-max", type=int, help="llama-server --spec-draft-n-max")
    a = ap.parse_args()
    kspec = ["--draft-model", a.draft_model] if a.draft_model else ["--spec", "ngram"]
    lspec = (["--spec-type", "draft-simple", "-md", a.draft_model] if a.draft_model
             else ["--spec-type", a.llama_spec_type])
    if a.draft_model and a.llama_draft_max:
        lspec += ["--spec-draft-n-max", str(a.llama_draft_max)]
    name = Path(a.model).stem
    url = f"http://127.0.0.1:{free_port()}"
    procs = [start([a.kvant, "serve", "-m", a.model, "--port", url.rsplit(":", 1)[1], "-t",
                    str(a.threads), *kspec, "-c", "4096"], url)]
    peer = []  # (base url, spec url)
    rows, peer_rows = {}, {}
    try:
        if a.llama_server:
            for extra in ([], lspec):
                u = f"http://127.0.0.1:{free_port()}"
                procs.append(start([a.llama_server, "-m", a.model, "--port", u.rsplit(":", 1)[1],
                                    "-t", str(a.threads), "-c", "4096", "-np", "1",
                                    *extra], u))
                peer.append(u)
        for wl, content in workloads().items():
            one(url, name, content, False, 8)  # warm-up: the prompt's blocks are cached
            for u in peer:
                one(u, name, content, False, 8)
            base, spec, pbase, pspec, same, psame = [], [], [], [], True, True
            for _ in range(a.rounds):  # alternating: kvant, kvant --spec, llama, llama --spec
                b = one(url, name, content, False, a.max_tokens)
                s = one(url, name, content, True, a.max_tokens)
                same &= b["text"] == s["text"]
                base.append(b["tps"])
                spec.append(s["tps"])
                if peer:
                    pb = one(peer[0], name, content, False, a.max_tokens)
                    ps = one(peer[1], name, content, True, a.max_tokens)
                    psame &= pb["text"] == ps["text"]
                    pbase.append(pb["tps"])
                    pspec.append(ps["tps"])
            rows[wl] = summary(base, spec, s, same)
            if peer:
                peer_rows[wl] = summary(pbase, pspec, ps, psame)
                rows[wl]["spec_vs_llama_spec"] = rows[wl]["spec_tps"] / peer_rows[wl]["spec_tps"]
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)
    isa = subprocess.run([a.kvant, "--isa"], capture_output=True, text=True).stdout.strip()
    out = {"model": a.model, "threads": a.threads, "rounds": a.rounds, "isa": isa,
           "max_tokens": a.max_tokens, "workloads": rows, "llama_server": peer_rows,
           "llama_spec_args": lspec if peer else None,
           "draft_model": a.draft_model}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{a.model}, isa {isa}, {a.threads} threads, median of {a.rounds}"
          + (f", draft model {a.draft_model}" if a.draft_model else ", prompt lookup"))
    print("workload   base tok/s  spec tok/s  ratio  drafted accepted  same")
    for wl, r in rows.items():
        acc = f"{r['acceptance']:.0%}" if r["acceptance"] is not None else "-"
        print(f"{wl:10} {r['base_tps']:10.1f} {r['spec_tps']:11.1f} {r['ratio']:6.2f} "
              f"{r['drafted']:8} {r['accepted']:8} ({acc})  {r['same_output']}")
    for wl, r in peer_rows.items():
        print(f"llama-server {wl:10} base {r['base_tps']:.1f} tok/s, {' '.join(lspec)} "
              f"{r['spec_tps']:.1f} tok/s ({r['ratio']:.2f}x); kvant --spec / "
              f"llama --spec {rows[wl]['spec_vs_llama_spec']:.2f}x")


if __name__ == "__main__":
    main()
