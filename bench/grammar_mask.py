#!/usr/bin/env python3
"""bench/grammar_mask.py - token-mask time per token over random walks of a
set of JSON schemas on the default model's vocabulary (49,152 tokens), and
the compile time of a 50-property schema.

    .venv/bin/python bench/grammar_mask.py [-m MODEL] [--walks 10] [--steps 100] [--json]

Each schema runs `kvant grammar --schema F --bench --walks N --steps S`:
N random walks (seeds 1..N, each a fresh sequence) that take tokens the
mask allows (structural tokens favoured so objects close), every mask's
CPU time (CLOCK_THREAD_CPUTIME_ID, one thread, scalar C) recorded.  Two
configurations: `shared` (one mask cache per grammar and vocabulary shared
by the walks, as a server keeps per compiled grammar: tmshare.h) and
`cold` (--no-share: each walk has only its own per-sequence memo).  p50 and
p99 are over all masks of all schemas.  The compile time is the median CPU
time of 20 compilations of a schema with 50 properties (strings, integers,
numbers, booleans; half required).  CPU time, not wall time: the numbers
are indicative on a shared machine.  The targets (issue 30): p50 <= 20 us,
p99 <= 200 us, compile <= 10 ms.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"

SCHEMAS = {
    "flat": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["name", "age", "ok"], "additionalProperties": False},
    "optional": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "null"}},
        "required": ["b"], "additionalProperties": False},
    "enum-array": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                 "minItems": 1, "maxItems": 3}},
        "required": ["color", "tags"], "additionalProperties": False},
    "nested-ref": {"$defs": {"pt": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"], "additionalProperties": False}},
        "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"},
                                         "to": {"$ref": "#/$defs/pt"}},
        "required": ["from", "to"], "additionalProperties": False},
    "anyof": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "[a-c]{2,4}"},
                        {"const": {"k": [1, 2]}}]},
    "person": {"type": "object", "properties": {
        "name": {"type": "string"}, "email": {"type": "string", "format": "uuid"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "city"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False},
}


def fifty_props():
    types = ["string", "integer", "number", "boolean"]
    props = {f"prop_{i}": {"type": types[i % 4]} for i in range(50)}
    return {"type": "object", "properties": props,
            "required": [f"prop_{i}" for i in range(0, 50, 2)], "additionalProperties": False}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))] if xs else 0.0


def run(binary, model, path, args):
    cmd = [binary, "grammar", "-m", model, "--schema", path, "--bench", "--json", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)}: {r.stderr}")
    return json.loads(r.stdout)


def cpu_name():
    try:
        for ln in open("/proc/cpuinfo"):
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--bin", default=os.environ.get("KVANT_BIN", "build/kvant"))
    ap.add_argument("--walks", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = {"cpu": cpu_name(), "walks": a.walks, "steps": a.steps, "schemas": {}}
    with tempfile.TemporaryDirectory() as d:
        allp = {"shared": [], "cold": []}
        schemas = dict(SCHEMAS, **{"fifty-props": fifty_props()})
        for name, schema in schemas.items():
            f = os.path.join(d, name + ".json")
            with open(f, "w") as fh:
                json.dump(schema, fh)
            row = {}
            for cfg, extra in (("shared", []), ("cold", ["--no-share"])):
                j = run(a.bin, a.model, f, ["--walks", str(a.walks), "--steps", str(a.steps),
                                            "--compiles", "5", *extra])
                t = j["mask_us"]
                allp[cfg] += t
                row[cfg] = {"masks": len(t), "p50_us": pct(t, 50), "p99_us": pct(t, 99),
                            "max_us": max(t) if t else 0.0}
                if cfg == "shared":
                    row["shared_cache"] = j.get("shared")
            res["schemas"][name] = row
        for cfg, t in allp.items():
            res[cfg] = {"masks": len(t), "p50_us": pct(t, 50), "p99_us": pct(t, 99),
                        "max_us": max(t) if t else 0.0}
        f = os.path.join(d, "fifty.json")
        with open(f, "w") as fh:
            json.dump(fifty_props(), fh)
        j = run(a.bin, a.model, f, ["--walks", "1", "--steps", "0", "--compiles", "20"])
        res["compile_50_props_us"] = j["compile_us_median"]
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(f"token masks, {res['cpu']}, scalar C, one thread, CPU time per mask; "
          f"{a.walks} walks x <= {a.steps} steps per schema")
    print(f"{'schema':<12} {'masks':>6} {'shared p50':>11} {'p99':>8} {'cold p50':>9} {'p99':>8}")
    for name, row in res["schemas"].items():
        s, c = row["shared"], row["cold"]
        print(f"{name:<12} {s['masks']:>6} {s['p50_us']:>11.1f} {s['p99_us']:>8.1f} "
              f"{c['p50_us']:>9.1f} {c['p99_us']:>8.1f}")
    s, c = res["shared"], res["cold"]
    print(f"{'all':<12} {s['masks']:>6} {s['p50_us']:>11.1f} {s['p99_us']:>8.1f} "
          f"{c['p50_us']:>9.1f} {c['p99_us']:>8.1f}")
    print(f"compile, 50-property schema: {res['compile_50_props_us']:.0f} us (median of 20)")


if __name__ == "__main__":
    main()
