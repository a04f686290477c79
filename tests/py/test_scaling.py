"""The scaling signal end to end: kvant under a load generator, a real Prometheus scraping it
(file service discovery with the namespace/pod labels Kubernetes discovery would add), and the
HPA's query -- the prometheus-adapter rule's metricsQuery from deploy/k8s, with its templates
filled as the adapter fills them -- evaluated through Prometheus' HTTP API: it rises above the
HPA's target under load and falls back to 0 after."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from server_util import KvantServer, free_port

ROOT = Path(__file__).resolve().parent.parent.parent
K8S = ROOT / "deploy" / "k8s"


def adapter_query() -> tuple[str, float]:
    cm = yaml.safe_load((K8S / "prometheus-adapter-rules.yaml").read_text())
    rule = yaml.safe_load(cm["data"]["config.yaml"])["rules"][0]
    hpa = yaml.safe_load((K8S / "hpa.yaml").read_text())
    target = float(hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"])
    series = rule["seriesQuery"].split("{")[0]
    q = (rule["metricsQuery"].replace("<<.Series>>", series)
         .replace("<<.LabelMatchers>>", 'namespace="default",pod=~"kvant-test"')
         .replace("<<.GroupBy>>", "pod"))
    return q, target


def prom_value(port: int, q: str) -> float | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": q}, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None
    res = r.get("data", {}).get("result", [])
    return float(res[0]["value"][1]) if res else None


def wait_for(port, q, pred, timeout):
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        v = prom_value(port, q)
        seen.append(v)
        if v is not None and pred(v):
            return v, seen
        time.sleep(0.5)
    return None, seen


def test_hpa_signal_rises_and_falls(kvant_bin, default_model, tmp_path):
    prom = shutil.which("prometheus")
    if prom is None:
        pytest.fail("prometheus missing: install the Debian package `prometheus` (setup-deps)",
                    pytrace=False)
    q, target = adapter_query()
    s = KvantServer(kvant_bin, default_model, "--max-num-seqs", "2", "--max-num-batched-tokens", "256")
    (tmp_path / "targets.json").write_text(json.dumps(
        [{"targets": [f"127.0.0.1:{s.port}"], "labels": {"namespace": "default", "pod": "kvant-test"}}]))
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: kvant
    file_sd_configs:
      - files: ['{tmp_path / "targets.json"}']
        refresh_interval: 1s
""")
    pport = free_port()
    log = open(tmp_path / "prom.log", "w")
    p = subprocess.Popen([prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                          f"--web.listen-address=127.0.0.1:{pport}", "--query.lookback-delta=5s"],
                         stdout=log, stderr=subprocess.STDOUT)
    stop = threading.Event()
    threads = []
    try:
        idle, seen0 = wait_for(pport, q, lambda v: v == 0, 60)
        assert idle == 0, f"no idle sample of {q}: {seen0[-5:]}\n" + (tmp_path / "prom.log").read_text()[-2000:]

        def client(i):
            while not stop.is_set():
                body = {"prompt": f"Request {i}: write about clouds.", "max_tokens": 48, "ignore_eos": True}
                try:
                    httpx.post(s.url + "/v1/completions", json=body, timeout=120)
                except httpx.HTTPError:
                    pass
        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        high, seen1 = wait_for(pport, q, lambda v: v > target, 90)
        assert high is not None, f"{q} never rose above {target}: {seen1[-10:]}"
        desired = math.ceil(1 * high / target)  # the HPA's rule for one current replica
        assert desired >= 2
        stop.set()
        for t in threads:
            t.join(180)
        low, seen2 = wait_for(pport, q, lambda v: v == 0, 60)
        assert low == 0, f"{q} did not fall back to 0: {seen2[-10:]}"
    finally:
        stop.set()
        for t in threads:
            t.join(180)
        p.terminate()
        p.wait(timeout=20)
        log.close()
        assert s.stop() == 0
    print(f"scaling signal: {q} idle 0 -> {high} under load (target {target}, "
          f"desired replicas {desired}) -> 0")
