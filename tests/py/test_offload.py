"""Weight offload (--weights-memory) on the default model (SmolLM2-135M Q4_1: 30 layers of
about 2.1 MiB, a 28.7 MiB embedding that is also the output head).

- `kvant logits`: every layer streamed (33MiB, the smallest budget) and half the layers
  streamed give bitwise the same logits as fully resident, with 1, 5 and 64 tokens per
  forward pass, on the int8 path (resident weights repacked, streamed ones as stored),
  with --exact and with --no-pack, with a 3-buffer ring, and with --stream-io direct and
  both (O_DIRECT reads, or the page cache where the filesystem refuses them).
- a budget under one layer ring plus the embedding is refused naming the smallest budget;
  a budget that holds everything warns and streams nothing.
- `kvant serve`: concurrent requests with chunked prefill answer with the same tokens and
  logprobs as a server without offload (page-cache and O_DIRECT reads); /v1/memory and
  /metrics report the placement, the bytes streamed and those read with O_DIRECT (or the
  note saying the filesystem refused it); a model file truncated under the server fails
  the requests in flight with a clear error and /health turns 503, the process does not
  crash.
- `kvant plan --weights-memory`: the placement, the measured rates (page cache, O_DIRECT,
  matmul and non-matmul work per bucket), cached; predictions that read every streamed
  byte at most at the mode's read rate.
- `kvant bench --weights-memory --json`: the stream's bytes, wall, read and wait seconds per
  series (absent without offload).
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess

import httpx
import numpy as np
import pytest

from server_util import KvantServer

THREADS = os.environ.get("KVANT_THREADS", "2")
SMALLEST = "33MiB"      # embedding/head 28.7 MiB + 2 x 2.1 MiB ring
HALF = "62MiB"          # about half the layers resident
IDS = [(i * 7919 + 13) % 40000 + 100 for i in range(70)]


def logits(kvant_bin, model, tmp_path, name, *args):
    toks = tmp_path / "ids.txt"
    toks.write_text(" ".join(map(str, IDS)))
    out = tmp_path / f"{name}.bin"
    r = subprocess.run([kvant_bin, "logits", "-m", model, "-t", THREADS, "--tokens-file",
                        str(toks), "--out", str(out), *args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return out.read_bytes(), r.stderr


@pytest.mark.parametrize("batch", ["1", "5", "64"])
def test_logits_bitwise(kvant_bin, default_model, tmp_path, batch):
    ref, _ = logits(kvant_bin, default_model, tmp_path, "ref", "-b", batch)
    assert len(ref) == len(IDS) * 49152 * 4
    for wm in (SMALLEST, HALF):
        got, _ = logits(kvant_bin, default_model, tmp_path, "off", "-b", batch,
                        "--weights-memory", wm)
        assert got == ref, f"--weights-memory {wm}, -b {batch}: logits differ"


@pytest.mark.parametrize("extra", [["--exact"], ["--no-pack"], ["--stream-buffers", "3"],
                                   ["--stream-io", "direct"], ["--stream-io", "both"]])
def test_logits_bitwise_paths(kvant_bin, default_model, tmp_path, extra):
    base = [e for e in extra if e not in ("--stream-buffers", "3", "--stream-io", "direct",
                                          "both")]
    ref, _ = logits(kvant_bin, default_model, tmp_path, "ref", "-b", "7", *base)
    wm = "36MiB" if "--stream-buffers" in extra else SMALLEST
    got, _ = logits(kvant_bin, default_model, tmp_path, "off", "-b", "7", "--weights-memory",
                    wm, *extra)
    assert got == ref
    f = np.frombuffer(got, dtype=np.float32)
    assert np.isfinite(f).all() and f.std() > 0


def test_refused_and_fits(kvant_bin, default_model, tmp_path):
    toks = tmp_path / "ids.txt"
    toks.write_text("1 2 3")
    cmd = [kvant_bin, "logits", "-m", default_model, "-t", THREADS, "--tokens-file", str(toks),
           "--out", str(tmp_path / "o.bin")]
    r = subprocess.run(cmd + ["--weights-memory", "20MiB"], capture_output=True, text=True)
    assert r.returncode != 0
    assert "smallest weights budget that works is 33MiB" in r.stderr, r.stderr
    r = subprocess.run(cmd + ["--weights-memory", "1.5"], capture_output=True, text=True)
    assert r.returncode == 2 and "--weights-memory" in r.stderr, r.stderr
    r = subprocess.run(cmd + ["--weights-memory", SMALLEST, "--stream-io", "mmap"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "'mmap' is not buffered, direct or both" in r.stderr, r.stderr
    r = subprocess.run(cmd + ["--weights-memory", "1GiB"], capture_output=True, text=True)
    assert r.returncode == 0 and "the model fits, no layer is streamed" in r.stderr, r.stderr
    # serve refuses at start, with the same message
    r = subprocess.run([kvant_bin, "serve", "-m", default_model, "-t", THREADS, "--port", "0",
                        "--weights-memory", "20MiB"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "smallest weights budget that works is 33MiB" in r.stderr


def complete(srv, i, max_tokens=6):
    prompt = [(i * 7919 + j * 31 + 11) % 40000 + 100 for j in range(20 + 9 * i)]
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1,
            "ignore_eos": True}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=300)
    return r


def workload(srv):
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        rs = list(ex.map(lambda i: complete(srv, i), range(6)))
    out = []
    for r in rs:
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        out.append((c["text"], c["logprobs"]["token_logprobs"]))
    return out


ARGS = ["--max-num-batched-tokens", "16", "--max-num-seqs", "8"]


def test_serve_same_answers_and_visible(kvant_bin, default_model):
    srv = KvantServer(kvant_bin, default_model, *ARGS)
    try:
        ref = workload(srv)
    finally:
        assert srv.stop() == 0
    srv = KvantServer(kvant_bin, default_model, *ARGS, "--weights-memory", HALF)
    try:
        got = workload(srv)
        assert got == ref
        mem = httpx.get(srv.url + "/v1/memory", timeout=30).json()
        off = mem["weights_offload"]
        assert off["enabled"] and 0 < off["streamed_layers"] < 30
        places = [layer["placement"] for layer in off["layers"]]
        assert places.count("streamed") == off["streamed_layers"]
        assert off["streamed_bytes_total"] >= off["streamed_bytes_per_forward"] > 0
        assert off["streamed_bytes_per_token"] > 0
        m = srv.metrics()
        assert m["kvant_weights_streamed_bytes_per_forward"] == off["streamed_bytes_per_forward"]
        assert m["kvant_weights_streamed_bytes_total"] > 0
        assert m["kvant_weights_stream_failed"] == 0
        assert m["kvant_weights_layer_bytes{layer=29,placement=streamed}"] > 0
        assert m["kvant_weights_layer_bytes{layer=0,placement=resident}"] > 0
        assert "weight offload:" in srv.log_text() and "layer placement:" in srv.log_text()
        assert "kvant: weight offload streams " in srv.log_text()  # the order and why
        assert off["stream_io"] == "buffered" and off["streamed_direct_bytes_total"] == 0
        assert m["kvant_weights_streamed_direct_bytes_total"] == 0
    finally:
        assert srv.stop() == 0
    # O_DIRECT reads: the same answers; where the filesystem refuses them, the
    # page cache and a note in the log and on /v1/memory
    srv = KvantServer(kvant_bin, default_model, *ARGS, "--weights-memory", HALF,
                      "--stream-io", "direct")
    try:
        assert workload(srv) == ref
        off = httpx.get(srv.url + "/v1/memory", timeout=30).json()["weights_offload"]
        m = srv.metrics()
        assert off["stream_io"] == "direct"
        assert "kvant: weight reads: direct" in srv.log_text()
        if off["direct"]:
            assert off["streamed_direct_bytes_total"] == off["streamed_bytes_total"] > 0
            # one snapshot each: the stream may read ahead between the two requests
            assert (m["kvant_weights_streamed_direct_bytes_total"]
                    == m["kvant_weights_streamed_bytes_total"] >= off["streamed_bytes_total"])
        else:
            assert "O_DIRECT refused" in off["io_note"] and off["io_note"] in srv.log_text()
    finally:
        assert srv.stop() == 0


def test_serve_truncated_model(kvant_bin, default_model, tmp_path):
    model = tmp_path / "copy.gguf"
    shutil.copyfile(default_model, model)
    srv = KvantServer(kvant_bin, str(model), *ARGS, "--weights-memory", SMALLEST)
    try:
        assert complete(srv, 0).status_code == 200
        os.truncate(model, 1 << 20)  # the header stays; every layer is gone
        errors = []
        for i in range(3):
            r = complete(srv, i + 1)
            if r.status_code != 200:
                errors.append(r.text)
            else:  # a streamed answer carries the error in the stream body
                assert "error" not in r.text, r.text
        assert errors, "no request failed after the model file was truncated"
        assert any("truncated or replaced" in e for e in errors), errors
        h = httpx.get(srv.url + "/health", timeout=10)
        assert h.status_code == 503 and "weight offload failed" in h.text, h.text
        assert srv.metrics()["kvant_weights_stream_failed"] == 1
        assert srv.proc.poll() is None, "the server died"
    finally:
        rc = srv.stop()
        assert rc == 0, srv.log_text()
    assert rc != -signal.SIGBUS


def test_plan_placement_and_prediction(kvant_bin, default_model, tmp_path):
    env = dict(os.environ, KVANT_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [kvant_bin, "plan", "-m", default_model, "-t", THREADS, "-c", "2048"]
    runs = []
    for _ in range(2):
        r = subprocess.run(cmd + ["--weights-memory", "40MiB", "--json"], capture_output=True,
                           text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout))
    off = runs[0]["weights_offload"]
    assert off["offload"] and len(off["layers"]) == 30
    places = [layer["placement"] for layer in off["layers"]]
    n_res = places.count("resident")
    n = 30 - n_res
    # auto: spread over the depth (layer 29 - floor(i * 30 / n) streamed) unless the measured
    # rates predict the last layers streamed faster (docs/ARCHITECTURE.md, "Weight offload")
    spread = {29 - i * 30 // n for i in range(n)}
    want = {"tail": ["resident"] * n_res + ["streamed"] * n,
            "spread": ["streamed" if il in spread else "resident" for il in range(30)]}
    pl = off["placement"]
    assert 0 < n_res < 30 and pl["asked"] == "auto" and pl["by_cost"]
    assert places == want[pl["order"]], (pl, places)
    tok = pl["predicted_decode_tok_s"]
    assert tok["tail"] > 0 and tok["spread"] > 0
    other = "tail" if pl["order"] == "spread" else "spread"
    assert tok[pl["order"]] >= tok[other] * 0.99
    assert abs(off["predicted"][0]["tok_s"] - tok[pl["order"]]) <= 1e-6 * tok[pl["order"]]
    for order in ("tail", "spread"):  # asked for: placed so, the same number streamed
        r = subprocess.run(cmd + ["--weights-memory", "40MiB", "--weights-place", order,
                                  "--json"], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        o = json.loads(r.stdout)["weights_offload"]
        assert [x["placement"] for x in o["layers"]] == want[order]
        assert o["placement"] == {**o["placement"], "order": order, "asked": order,
                                  "by_cost": False}
    assert off["resident_bytes"] + off["staging_bytes"] <= 40 << 20
    assert runs[0]["plans"][0]["plan"]["weights_bytes"] == off["resident_bytes"] + \
        off["staging_bytes"]
    assert not off["rates"]["cached"] and runs[1]["weights_offload"]["rates"]["cached"]
    assert (tmp_path / "cache" / "offload-rates").exists()
    rates = off["rates"]
    assert rates["read_bytes_per_s"] > 0 and rates["direct_read_bytes_per_s"] >= 0
    assert rates["stream_io"] == "buffered"
    other = [b["other_s_per_layer"] for b in rates["matmul"]]
    assert all(o > 0 for o in other) and other[-1] > other[0]  # 512 tokens of norms vs 1
    pred = off["predicted"]
    assert [p["tokens_per_pass"] for p in pred] == [1, 8, 32, 128, 512]
    for p in pred:
        # (1e-5: the JSON prints 6 significant digits; a read-bound pass equals its bound)
        assert p["tok_s"] > 0 and p["tok_s"] <= p["resident_tok_s"] * (1 + 1e-5)
        assert p["pass_s"] >= p["stall_s"] >= 0
        # a pass reads every streamed byte at most at the faster page-cache rate, alone or
        # beside the matmuls (measured separately: on a noisy machine either may be higher)
        fastest = max([rates["read_bytes_per_s"]] +
                      [b["side_by_side_read_bytes_per_s"] for b in rates["matmul"]])
        assert p["pass_s"] >= off["streamed_bytes_per_forward"] / fastest * (1 - 1e-5)
    # the prediction for O_DIRECT reads, from the same cached rates
    r = subprocess.run(cmd + ["--weights-memory", "40MiB", "--stream-io", "direct", "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    od = json.loads(r.stdout)["weights_offload"]
    assert od["rates"]["cached"] and od["rates"]["stream_io"] == "direct"
    direct = od["rates"]["direct_read_bytes_per_s"] or rates["read_bytes_per_s"]  # 0: refused
    for p in od["predicted"]:
        assert p["pass_s"] >= od["streamed_bytes_per_forward"] / direct * (1 - 1e-5)
    # text form and --remeasure
    r = subprocess.run(cmd + ["--weights-memory", "40MiB", "--remeasure"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and "layer placement: R" in r.stdout and "measured now" in r.stdout
    assert re.search(r"streamed layers (spread over the depth|last) \(--weights-place auto: "
                     r"predicted decode [0-9.]+ tok/s", r.stdout), r.stdout
    # refused with the smallest budget; a budget that holds everything warns
    r = subprocess.run(cmd + ["--weights-memory", "10MiB"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 1 and "smallest weights budget that works is 33MiB" in r.stderr
    r = subprocess.run(cmd + ["--weights-memory", "1GiB", "--json"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["weights_offload"]["offload"] is False


def test_bench_reports_the_stream(kvant_bin, default_model):
    """kvant bench with offload: the stream's bytes, wall, read and wait time of each series."""
    r = subprocess.run([kvant_bin, "bench", "-m", default_model, "-t", THREADS, "-p", "8", "-n",
                        "4", "-r", "2", "--weights-memory", SMALLEST, "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    per_pass = 30 * 2_000_000  # 30 streamed layers of about 2.1 MB, at least
    assert b["tg_stream_bytes"] >= 2 * 4 * per_pass  # 2 reps of 4 decode passes
    assert b["pp_stream_bytes"] >= 2 * per_pass      # 2 reps of one 8-token pass
    for t in ("pp", "tg"):
        assert b[f"{t}_stream_wall_s"] > 0 and b[f"{t}_stream_read_s"] > 0
        assert 0 <= b[f"{t}_stream_wait_s"] <= b[f"{t}_stream_wall_s"]
    r = subprocess.run([kvant_bin, "bench", "-m", default_model, "-t", THREADS, "-p", "8", "-n",
                        "4", "-r", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "tg_stream_bytes" not in json.loads(r.stdout)
