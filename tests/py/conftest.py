"""Shared fixtures for the kvant Python tests (run from the repository root).

Fixtures: kvant_bin (path of the kvant binary; env KVANT_BIN, default build/kvant — a missing
binary is a test FAILURE, never a skip), default_model (models/SmolLM2-135M-Instruct.Q4_1.gguf),
synthetic_dir (session directory for make_synthetic models), kvant_logits / kvant_tokenize
(helpers that run the CLI), record_result (writes numbers to build/test-results/NAME.json).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
KVANT_TIMEOUT = float(os.environ.get("KVANT_TEST_TIMEOUT", "300"))
KVANT_THREADS = os.environ.get("KVANT_THREADS", "2")


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: run by itself after the others (make pytest: "
                                       "timing-sensitive, no test on another worker beside it)")


def _resolve(p: str) -> Path:
    q = Path(p)
    if not q.is_absolute() and not q.exists():
        q = ROOT / q
    return q


@pytest.fixture(scope="session")
def kvant_bin() -> str:
    p = _resolve(os.environ.get("KVANT_BIN", "build/kvant"))
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(f"kvant binary not found or not executable: {p} "
                    f"(build it with `make`, or set KVANT_BIN)", pytrace=False)
    return str(p)


@pytest.fixture(scope="session")
def testhooks_bin(kvant_bin) -> str:
    """build/kvant-testhooks: build/kvant with the engine's test hooks (src/engine/engine.c,
    KVANT_TEST_HOOKS), next to kvant_bin unless KVANT_TESTHOOKS_BIN names it."""
    p = Path(os.environ.get("KVANT_TESTHOOKS_BIN", Path(kvant_bin).parent / "kvant-testhooks"))
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(f"test build not found: {p} (make build/kvant-testhooks)", pytrace=False)
    return str(p)


@pytest.fixture(scope="session")
def default_model() -> str:
    p = _resolve(os.environ.get("KVANT_MODEL", DEFAULT_MODEL))
    if not p.is_file():
        pytest.fail(f"default model missing: {p} (run `make model`)", pytrace=False)
    return str(p)


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def results_dir() -> Path:
    d = ROOT / "build" / "test-results"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def record_result(results_dir):
    """f(name, dict): write build/test-results/NAME.json."""
    def f(name: str, data: dict) -> None:
        (results_dir / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return f


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=KVANT_TIMEOUT)


@pytest.fixture(scope="session")
def kvant_logits(kvant_bin, tmp_path_factory):
    """f(model, ids) -> float32 logits [n][n_vocab] from `kvant logits` (asserts exit 0, size)."""
    work = tmp_path_factory.mktemp("kvant_logits")
    counter = [0]

    def f(model: str, ids, n_vocab: int, threads: str = KVANT_THREADS) -> np.ndarray:
        counter[0] += 1
        ids_path = work / f"ids{counter[0]}.txt"
        out_path = work / f"logits{counter[0]}.f32"
        ids_path.write_text(" ".join(str(int(i)) for i in ids) + "\n")
        cmd = [kvant_bin, "logits", "-m", model, "--tokens-file", str(ids_path), "--out", str(out_path), "-t", str(threads),
               "--kv-dtype", "f32", "--exact"]  # the reference path: f32 K/V and activations
        r = _run(cmd)
        assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\nstderr:\n{r.stderr[-4000:]}"
        assert out_path.is_file(), f"kvant logits wrote no {out_path}"
        a = np.fromfile(out_path, dtype="<f4")
        assert a.size == len(ids) * n_vocab, (f"logits file has {a.size} floats, expected "
                                              f"{len(ids)} x {n_vocab} = {len(ids) * n_vocab}")
        out_path.unlink()
        return a.reshape(len(ids), n_vocab)

    return f


@pytest.fixture(scope="session")
def kvant_tokenize(kvant_bin):
    """f(model, file) -> list of ids from `kvant tokenize --json`."""
    def f(model: str, path: str) -> list[int]:
        cmd = [kvant_bin, "tokenize", "-m", model, "-f", str(path), "--json"]
        r = _run(cmd)
        assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\nstderr:\n{r.stderr[-4000:]}"
        ids = json.loads(r.stdout)
        assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), "tokenize --json: not a list of ints"
        return ids

    return f


@pytest.fixture(scope="session")
def run_kvant(kvant_bin):
    """f(args) -> CompletedProcess of `kvant ARGS`."""
    return lambda args: _run([kvant_bin, *map(str, args)])


def _empty_dir(request, base: Path):
    """An empty directory under base for the test, removed afterwards (a generator)."""
    import shutil
    import uuid
    d = base / f"kvant-{request.module.__name__}-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tier_dir(request):
    """An empty directory under build/ for a KV disk tier, removed afterwards."""
    yield from _empty_dir(request, ROOT / "build")


@pytest.fixture
def tier_dir_tmpfs(request):
    """As tier_dir, on tmpfs when /dev/shm has 1 GiB free: every record written is fsynced, and
    on a disk an fsync beside other tests writing gigabytes waits for their dirty pages too (a
    CI run had 8 of 12 records after 120 s).  For tests whose point (records surviving kill -9
    or SIGTERM) does not depend on the device under the page cache."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
        roomy = os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize >= (1 << 30)
    except OSError:
        roomy = False
    yield from _empty_dir(request, shm if roomy else ROOT / "build")
