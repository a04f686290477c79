"""A seeded generator of JSON schemas for the structured-output corpus (test_structured.py).

The schemas combine what kvant's JSON Schema front end supports (src/grammar/jschema.h):
objects with required subsets and additionalProperties false, arrays with min/maxItems,
strings with lengths, formats and anchored patterns, integer bounds (inclusive and
exclusive), numbers with minimum 0, booleans, null, enum and const of mixed values,
type lists, anyOf / oneOf / allOf of one, and $defs with $ref.  Every schema is bounded
(strings have maxLength or a format/pattern of bounded length, arrays maxItems, depth at
most 3), so each has a short complete output; `jsonschema` checks each is a valid schema.
"""
from __future__ import annotations

import random

import jsonschema

PATTERNS = ["^[A-Z]{2}[0-9]{3}$", "^(yes|no)$", "^[a-f0-9]{4}$", "^v[0-9]\\.[0-9]$",
            "^[a-z]{1,6}@[a-z]{2,5}\\.com$"]
FORMATS = ["date", "time", "date-time", "uuid"]
WORDS = ["id", "name", "kind", "size", "tags", "items", "owner", "state", "count", "note",
         "value", "when", "score", "flag", "path", "level", "mode", "ref", "unit", "code"]


def _leaf(r: random.Random) -> dict:
    k = r.randrange(12)
    if k == 0:
        s = {"type": "string", "maxLength": r.randint(1, 10)}
        if r.random() < 0.4:
            s["minLength"] = r.randint(0, s["maxLength"])
        return s
    if k == 1:
        return {"type": "string", "format": r.choice(FORMATS)}
    if k == 2:
        return {"type": "string", "pattern": r.choice(PATTERNS)}
    if k == 3:
        lo = r.randint(-100, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + r.randint(0, 200)}
    if k == 4:
        lo = r.randint(-10, 10)
        return {"type": "integer", "exclusiveMinimum": lo, "exclusiveMaximum": lo + r.randint(2, 30)}
    if k == 5:
        return {"type": "number", "minimum": 0}
    if k == 6:
        return {"type": "boolean"}
    if k == 7:
        return {"type": "null"}
    if k == 8:
        pool = ["a", "bb", "on", "off", 0, 1, 42, -3, True, False, None, "x y"]
        return {"enum": r.sample(pool, r.randint(1, 5))}
    if k == 9:
        return {"const": r.choice(["fixed", 7, True, None, {"v": 1}, [1, "a"]])}
    if k == 10:
        lo = r.randint(0, 5)
        return {"type": ["integer", "null"], "minimum": lo, "maximum": lo + r.randint(0, 9)}
    return {"type": "string", "enum": r.sample(["low", "mid", "high", "max"], r.randint(1, 4))}


def _node(r: random.Random, depth: int) -> dict:
    if depth >= 3 or r.random() < 0.35:
        return _leaf(r)
    k = r.randrange(6)
    if k <= 1:
        return _object(r, depth)
    if k == 2:
        a = {"type": "array", "items": _node(r, depth + 1), "maxItems": r.randint(1, 3)}
        if r.random() < 0.5:
            a["minItems"] = r.randint(0, a["maxItems"])
        return a
    if k == 3 and r.random() < 0.5:
        return {"anyOf": [_node(r, depth + 1) for _ in range(r.randint(2, 3))]}
    if k == 3:  # oneOf, read as anyOf by kvant: alternatives of distinct types, so one matches
        alts = [{"type": "string", "maxLength": r.randint(1, 8)},
                {"type": "integer", "minimum": 0, "maximum": r.randint(0, 99)},
                {"type": "boolean"}, {"type": "null"},
                {"type": "object", "properties": {"k": {"type": "boolean"}},
                 "required": ["k"], "additionalProperties": False}]
        return {"oneOf": r.sample(alts, r.randint(2, 3))}
    if k == 4:
        return {"allOf": [_object(r, depth)]}
    return {"type": "array", "items": _leaf(r), "minItems": 1, "maxItems": r.randint(1, 4)}


def _object(r: random.Random, depth: int) -> dict:
    names = r.sample(WORDS, r.randint(1, 4))
    o = {"type": "object", "properties": {n: _node(r, depth + 1) for n in names}}
    req = [n for n in names if r.random() < 0.7]
    if req:
        o["required"] = req
    if r.random() < 0.6:
        o["additionalProperties"] = False
    return o


def _with_refs(r: random.Random) -> dict:
    """A $defs entry used from two places (and once from inside an array)."""
    d = _object(r, 2)
    return {"$defs": {"part": d}, "type": "object",
            "properties": {"main": {"$ref": "#/$defs/part"},
                           "more": {"type": "array", "items": {"$ref": "#/$defs/part"},
                                    "maxItems": 2}},
            "required": ["main"], "additionalProperties": False}


def corpus(n: int = 200, seed: int = 2026) -> list[dict]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        sc = _with_refs(r) if i % 10 == 9 else _node(r, 0) if i % 3 else _object(r, 0)
        jsonschema.Draft202012Validator.check_schema(sc)
        out.append(sc)
    return out
