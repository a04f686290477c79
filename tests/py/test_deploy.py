"""deploy/: Prometheus scrape config and alert rules (promtool check config / check rules / test
rules), the Grafana dashboard (every query compiles with promtool and names only series kvant
exports), Kubernetes manifests validated offline with kubernetes-validate (strict), and the
probe / drain / autoscaling wiring between them."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from server_util import server  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"


def promtool() -> str:
    p = shutil.which("promtool")
    if p is None:
        pytest.fail("promtool missing: install the Debian package `prometheus` (setup-deps)",
                    pytrace=False)
    return p


def run(*cmd, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=120, cwd=cwd)


def kubernetes_validate(path: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "kubernetes-validate"
    return run(str(exe), "--strict", "-k", "1.31.0", str(path))


def exported_series(server) -> set[str]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    names = set()
    for name, typ in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(name)
        if typ == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


def test_prometheus_config_and_alerts(tmp_path):
    pt = promtool()
    d = DEPLOY / "prometheus"
    r = run(pt, "check", "config", "prometheus.yml", cwd=d)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(pt, "check", "rules", "alerts.yml", cwd=d)
    assert r.returncode == 0 and "4 rules found" in r.stdout, r.stdout + r.stderr
    r = run(pt, "test", "rules", "alerts_test.yml", cwd=d)
    assert r.returncode == 0, r.stdout + r.stderr
    # the checks can fail: a broken expression and a wrong expectation are caught
    bad = tmp_path / "alerts.yml"
    bad.write_text((d / "alerts.yml").read_text().replace("> 0.9", "> > 0.9"))
    assert run(pt, "check", "rules", str(bad)).returncode != 0
    wrong = (d / "alerts.yml").read_text().replace("kvant_kv_usage_ratio > 0.9", "kvant_kv_usage_ratio > 0.99")
    (tmp_path / "alerts.yml").write_text(wrong)
    shutil.copy(d / "alerts_test.yml", tmp_path / "alerts_test.yml")
    assert run(pt, "test", "rules", "alerts_test.yml", cwd=tmp_path).returncode != 0


def test_alerts_and_scrape_name_real_series(server):
    names = exported_series(server)
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for g in rules["groups"]:
        for rule in g["rules"]:
            for m in re.findall(r"\bkvant_\w+", rule["expr"]):
                assert m in names, (rule["alert"], m)
    k = yaml.safe_load((DEPLOY / "prometheus" / "scrape-kubernetes.yml").read_text())
    job = k["scrape_configs"][0]
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"namespace", "pod"} <= targets and job["kubernetes_sd_configs"][0]["role"] == "pod"


def test_grafana_dashboard(server, tmp_path):
    pt = promtool()
    d = json.loads((DEPLOY / "grafana" / "kvant.json").read_text())
    titles = {p["title"] for p in d["panels"]}
    for need in ("Memory by category vs budget", "KV cache", "Queue", "Time to first token",
                 "Inter-token latency", "Prefix cache hit rate (tokens)", "Preemptions"):
        assert need in titles, need
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    names = exported_series(server)
    for e in exprs:
        for m in re.findall(r"\bkvant_\w+", e):
            assert m in names, (e, m)
    # every query is valid PromQL: compile them as recording rules
    rules = {"groups": [{"name": "grafana", "rules": [
        {"record": f"kvant_grafana_check_{i}", "expr": e.replace("$instance", ".*")}
        for i, e in enumerate(exprs)]}]}
    f = tmp_path / "grafana_rules.yml"
    f.write_text(yaml.safe_dump(rules))
    r = run(pt, "check", "rules", str(f))
    assert r.returncode == 0, r.stdout + r.stderr
    assert any("histogram_quantile(0.99" in e and "time_to_first_token" in e for e in exprs)


def test_kubernetes_manifests_validate(tmp_path):
    for f in ("deployment.yaml", "service.yaml", "hpa.yaml", "prometheus-adapter-rules.yaml"):
        r = kubernetes_validate(K8S / f)
        assert r.returncode == 0 and "passed" in (r.stdout + r.stderr), (f, r.stdout + r.stderr)
    # strict validation rejects what Kubernetes would reject
    bad = tmp_path / "bad.yaml"
    bad.write_text((K8S / "deployment.yaml").read_text().replace("periodSeconds: 2\n",
                                                                 "periodSecond: 2\n", 1))
    r = kubernetes_validate(bad)
    assert r.returncode != 0, r.stdout + r.stderr


def test_probes_drain_and_scaling_wiring(server):
    dep = yaml.safe_load((K8S / "deployment.yaml").read_text())
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    args = c["args"]
    drain = float(args[args.index("--drain-timeout") + 1])
    pre = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pre + drain + 5
    assert c["ports"][0]["name"] == "http" and "--host" in args
    # the routes the probes use answer on a live server
    assert httpx.get(server.url + "/ready").status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200

    names = exported_series(server)
    hpa = yaml.safe_load((K8S / "hpa.yaml").read_text())
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric == "kvant_num_requests_waiting" and metric in names
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    cm = yaml.safe_load((K8S / "prometheus-adapter-rules.yaml").read_text())
    rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    exposed = set()
    for rule in rules:
        series = re.match(r"^(\w+)\{", rule["seriesQuery"]).group(1)
        assert series in names and ":" not in series
        m = re.match(rule["name"]["matches"], series)
        exposed.add(m.expand(rule["name"]["as"].replace("${1}", r"\1")))
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
        for tpl in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert tpl in rule["metricsQuery"]
    assert metric in exposed

    keda = yaml.safe_load((K8S / "keda-scaledobject.yaml").read_text())
    assert keda["apiVersion"] == "keda.sh/v1alpha1" and keda["kind"] == "ScaledObject"
    assert keda["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    trig = keda["spec"]["triggers"][0]
    assert trig["type"] == "prometheus" and float(trig["metadata"]["threshold"]) == 5
    assert re.findall(r"\bkvant_\w+", trig["metadata"]["query"]) == [metric]
    assert hpa["spec"]["maxReplicas"] == keda["spec"]["maxReplicaCount"]
