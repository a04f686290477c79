"""guidellm 0.8.1 (pinned, its own venv: `make guidellm-venv`) benchmarks `kvant serve` on the
default model: a short concurrency sweep (1 and 2 streams, 4 requests each, synthetic
prompts made with a tokenizer that transformers built offline from the GGUF itself) that must
finish with 0 errored requests, every request completed with exactly the tokens asked for,
and guidellm's token counts matching the server's own: each completed prompt's count equals
the transformers tokenizer's count of that text (an independent implementation), and the
prompt tokens of every request guidellm sent add up to the server's kvant_prompt_tokens_total
(beside at most one request a level that guidellm processed but did not record).
guidellm's default request (streaming, stream_options with vLLM's continuous_usage_stats,
ignore_eos, stop: null) is what it sends here.  Numbers go to build/test-results/guidellm.json.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from server_util import KvantServer

ROOT = Path(__file__).resolve().parent.parent.parent
VENV = ROOT / "build" / "guidellm-venv"
TOK = ROOT / "build" / "guidellm-tok"
MODEL = "SmolLM2-135M-Instruct.Q4_1"
PROMPT_TOKENS, OUTPUT_TOKENS, STREAMS = 32, 16, [1, 2]
REQUESTS, SECONDS = 4, 90  # per level: this many requests, within at most this many seconds
# (max_requests ends a level as soon as its 4 requests complete: about 5 s when the machine
# is quiet; the duration bound only matters on a loaded machine, where 30 s once fell short)


@pytest.fixture(scope="module")
def guidellm():
    exe = VENV / "bin" / "guidellm"
    if not exe.is_file() or not (TOK / "tokenizer.json").is_file():
        pytest.fail(f"{exe} or {TOK} missing: run `make guidellm-venv`", pytrace=False)
    return exe


def offline_env() -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false",
               # guidellm's defaults (10 worker processes, each polling every 0.1 ms) would
               # take a 2-core machine's cores from the server it measures
               GUIDELLM__MAX_WORKER_PROCESSES="1", GUIDELLM__DEFAULT_ASYNC_LOOP_SLEEP="0.001")
    return env


def run_sweep(guidellm, url: str, out: Path) -> subprocess.CompletedProcess:
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": MODEL,
                    "request_format": "/v1/completions", "http2": False},
        "profile": {"kind": "concurrent"},
        "tokenizer": {"kind": "huggingface_auto", "model": str(TOK)},
        "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS,
                  "output_tokens": OUTPUT_TOKENS}],
        "constraints": [{"kind": "max_requests", "count": REQUESTS},
                        {"kind": "max_duration", "seconds": SECONDS}],
        "outputs": [{"kind": "json", "path": str(out)}]},
        "benchmarks": [{"profile.streams": n} for n in STREAMS]}
    sc = out.with_suffix(".scenario.json")
    sc.write_text(json.dumps(scenario))
    return subprocess.run([str(guidellm), "run", "--scenario", str(sc),
                           "--disable-console-interactive"], capture_output=True, text=True,
                          timeout=360, env=offline_env(), cwd=out.parent)


def tokenizer_counts(prompts: list[str]) -> list[int]:
    """The transformers tokenizer (built from the GGUF) on each prompt, without special tokens."""
    code = ("import json, sys\nfrom transformers import AutoTokenizer\n"
            f"t = AutoTokenizer.from_pretrained({str(TOK)!r})\n"
            "ps = json.load(sys.stdin)\n"
            "print(json.dumps([len(t(p, add_special_tokens=False)['input_ids']) for p in ps]))\n")
    r = subprocess.run([str(VENV / "bin" / "python"), "-c", code], input=json.dumps(prompts),
                       capture_output=True, text=True, timeout=120, env=offline_env())
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_guidellm_sweep(kvant_bin, default_model, guidellm, tmp_path, record_result):
    s = KvantServer(kvant_bin, default_model)
    try:
        before = s.metrics()
        out = tmp_path / "guidellm.json"
        r = run_sweep(guidellm, s.url, out)
        assert r.returncode == 0, f"guidellm exited {r.returncode}\n{r.stdout[-3000:]}\n" \
                                  f"{r.stderr[-3000:]}"
        m = s.wait_idle(before["kvant_kv_blocks_used"])
    finally:
        assert s.stop() == 0, s.log_text()
    report = json.loads(out.read_text())
    benches = report["benchmarks"]
    assert len(benches) == len(STREAMS)
    rows, prompts, counted, sent_prompt_tokens, unrecorded = [], [], [], 0, 0
    for n, b in zip(STREAMS, benches):
        req = b["requests"]
        errs = [e.get("error") for e in req["errored"]]
        assert not errs, f"concurrency {n}: {len(errs)} errored, e.g. {errs[:3]}"
        # guidellm 0.8.1 can end a level at max_requests before it records the last request it
        # processed (seen once: 3 of 4 recorded in 0.64 s, none errored or incomplete, each
        # recorded request whole); the server's counters below must account for such a request
        assert REQUESTS - 1 <= len(req["successful"]) <= REQUESTS, \
            f"concurrency {n}: {len(req['successful'])} of {REQUESTS} completed in {SECONDS} s"
        unrecorded += REQUESTS - len(req["successful"]) - len(req["incomplete"])
        for q in req["successful"]:
            assert q["output_tokens"] == OUTPUT_TOKENS, q["output_tokens"]
            prompts.append(json.loads(q["request_args"])["body"]["prompt"])
            counted.append(q["prompt_tokens"])
        for kind in ("successful", "incomplete", "errored"):
            sent_prompt_tokens += sum(q["prompt_tokens"] or 0 for q in req[kind])
        dur = b["duration"]
        out_tok = sum(q["output_tokens"] for q in req["successful"])
        rows.append({"streams": n, "completed": len(req["successful"]),
                     "incomplete": len(req["incomplete"]), "errored": 0,
                     "seconds": round(dur, 2), "output_tok_s": round(out_tok / dur, 2)})
    # the prompt counts guidellm reports (the server's usage) against transformers' tokenizer
    assert counted == tokenizer_counts(prompts)
    served = m["kvant_prompt_tokens_total"] - before["kvant_prompt_tokens_total"]
    # every request guidellm recorded reached the server, and the server served no other but
    # the ones guidellm did not record (at most one a level, each one prompt)
    assert sent_prompt_tokens <= served <= sent_prompt_tokens + unrecorded * max(counted), \
        (sent_prompt_tokens, served, unrecorded)
    generated = m["kvant_generation_tokens_total"] - before["kvant_generation_tokens_total"]
    done = sum(r["completed"] for r in rows) * OUTPUT_TOKENS
    assert done <= generated, (done, generated)
    record_result("guidellm", {"levels": rows, "prompt_tokens": PROMPT_TOKENS,
                               "output_tokens": OUTPUT_TOKENS, "server_prompt_tokens": served,
                               "server_generated_tokens": generated})
