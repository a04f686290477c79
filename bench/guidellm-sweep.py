#!/usr/bin/env python3
"""bench/guidellm-sweep.py - guidellm 0.8.1 (build/guidellm-venv, `make guidellm-venv`) against
`kvant serve` and, given --llama-server BIN, against llama.cpp's llama-server on the same GGUF,
alternating level by level (kvant then llama-server at each concurrency, both servers started
once and idle while the other is measured), printing per level and server: completed, errored,
incomplete requests, the error kinds, output tok/s (completed requests' output tokens over
the level's duration), and guidellm's TTFT p50 and inter-token latency p50 / p99.

    .venv/bin/python bench/guidellm-sweep.py [--levels 1,4,16,64,128,256,512] [--seconds 30]
        [--prompt-tokens 128] [--output-tokens 64] [-t 2] [-m MODEL]
        [--llama-server build/peer/build/bin/llama-server] [--json OUT]

guidellm's synthetic prompts use the tokenizer transformers built offline from the GGUF
(build/guidellm-tok); requests are /v1/completions, streamed, with guidellm's default fields
(stream_options with continuous_usage_stats, ignore_eos, stop: null).  llama-server gets
--parallel equal to kvant's --max-num-seqs (64) and a context of that many sequences.  Run
it on a quiet machine: anything else on the cores makes the numbers meaningless.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
GL = ROOT / "build" / "guidellm-venv" / "bin" / "guidellm"
TOK = ROOT / "build" / "guidellm-tok"
DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
SEQS = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, log: Path):
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"guidellm-sweep: {name} exited {self.proc.returncode} at start: "
                         f"{' '.join(cmd)} (log {log})")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                sys.exit(f"guidellm-sweep: {name} not healthy after 120 s (log {log})")
            time.sleep(0.2)

    def model_id(self) -> str:
        return httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def guidellm_env(workers: int) -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", GUIDELLM__MAX_WORKER_PROCESSES=str(workers),
               GUIDELLM__DEFAULT_ASYNC_LOOP_SLEEP="0.001")
    return env


def run_level(srv: Server, level: int, a, work: Path) -> dict:
    out = work / f"{srv.name}-{level}.json"
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": srv.url, "model": srv.model_id(),
                    "request_format": "/v1/completions", "http2": False, "timeout": 600},
        "profile": {"kind": "concurrent", "streams": [level]},
        "tokenizer": {"kind": "huggingface_auto", "model": str(TOK)},
        "data": [{"kind": "synthetic_text", "prompt_tokens": a.prompt_tokens,
                  "output_tokens": a.output_tokens}],
        "constraints": [{"kind": "max_duration", "seconds": a.seconds}],
        "outputs": [{"kind": "json", "path": str(out)}]}}
    sc = work / f"{srv.name}-{level}.scenario.json"
    sc.write_text(json.dumps(scenario))
    r = subprocess.run([str(GL), "run", "--scenario", str(sc), "--disable-console"],
                       capture_output=True, text=True, env=guidellm_env(a.workers),
                       cwd=work, timeout=a.seconds * 4 + 600)
    if r.returncode or not out.is_file():
        return {"server": srv.name, "level": level, "failed": r.returncode,
                "stderr": r.stderr[-400:]}
    b = json.loads(out.read_text())["benchmarks"][0]
    req = b["requests"]
    kinds = collections.Counter((q.get("error") or "?").split("(")[0][:40]
                                for q in req["errored"])
    out_tok = sum(q["output_tokens"] or 0 for q in req["successful"])

    def pct(metric, p):
        try:
            return round(b["metrics"][metric]["successful"]["percentiles"][p], 1)
        except (KeyError, TypeError):
            return None
    return {"server": srv.name, "level": level, "completed": len(req["successful"]),
            "errored": len(req["errored"]), "incomplete": len(req["incomplete"]),
            "errors": dict(kinds), "seconds": round(b["duration"], 2),
            "output_tok_s": round(out_tok / b["duration"], 2) if b["duration"] else 0.0,
            "ttft_ms_p50": pct("time_to_first_token_ms", "p50"),
            "itl_ms_p50": pct("inter_token_latency_ms", "p50"),
            "itl_ms_p99": pct("inter_token_latency_ms", "p99")}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,4,16,64,128,256,512")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--kvant", default=str(ROOT / "build" / "kvant"))
    ap.add_argument("--llama-server", help="llama-server binary (llama.cpp 0c1e570)")
    ap.add_argument("--workers", type=int, default=2, help="guidellm worker processes")
    ap.add_argument("--max-itl-ms", type=int, default=None, help="kvant serve --max-itl-ms")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    if not GL.is_file() or not (TOK / "tokenizer.json").is_file():
        sys.exit("guidellm-sweep: build/guidellm-venv or build/guidellm-tok missing: "
                 "run `make guidellm-venv`")
    levels = [int(x) for x in a.levels.split(",")]
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))
    work = Path(tempfile.mkdtemp(prefix="guidellm-sweep-"))
    ctx = a.prompt_tokens + a.output_tokens + 64
    servers = []
    try:
        p = free_port()
        servers.append(Server("kvant", [a.kvant, "serve", "-m", a.model, "--port", str(p),
                                        "-t", str(a.threads), "--max-num-seqs", str(SEQS)]
                              + ([] if a.max_itl_ms is None else ["--max-itl-ms",
                                                                  str(a.max_itl_ms)]),
                              p, work / "kvant.log"))
        if a.llama_server:
            p = free_port()
            servers.append(Server("llama-server", [
                a.llama_server, "-m", a.model, "--port", str(p), "--host", "127.0.0.1",
                "-t", str(a.threads), "-np", str(SEQS), "-c", str(SEQS * ctx), "-cb"],
                p, work / "llama-server.log"))
        rows = []
        print(f"{'server':<13} {'level':>5} {'done':>6} {'err':>5} {'inc':>5} {'s':>6} "
              f"{'out tok/s':>10} {'TTFT p50':>9} {'ITL p50':>8} {'ITL p99':>8}  errors",
              flush=True)
        for level in levels:
            for srv in servers:
                row = run_level(srv, level, a, work)
                rows.append(row)
                if "failed" in row:
                    print(f"{srv.name:<13} {level:>5} guidellm failed ({row['failed']}): "
                          f"{row['stderr']}", flush=True)
                    continue
                print(f"{srv.name:<13} {level:>5} {row['completed']:>6} {row['errored']:>5} "
                      f"{row['incomplete']:>5} {row['seconds']:>6} {row['output_tok_s']:>10} "
                      f"{str(row['ttft_ms_p50']):>9} {str(row['itl_ms_p50']):>8} "
                      f"{str(row['itl_ms_p99']):>8}  {row['errors'] or ''}", flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    finally:
        for srv in servers:
            srv.stop()
    print(f"(logs and guidellm reports in {work})")


if __name__ == "__main__":
    main()
