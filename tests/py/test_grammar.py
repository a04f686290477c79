"""The grammar engine (src/grammar/) against independent references.

Token masks of `kvant grammar --stdin` are compared with llguidance's
(PyPI llguidance, its own Earley parser and lexer) for the same grammar and
the default model's vocabulary (49,152 tokens), step by step along random
walks that take tokens both allow.  Every difference must fall under a
cause listed in EXPLAINED; anything else fails.  Outputs of walks that end
are validated with the jsonschema package (schemas) or Python's re
(regexes).  Mask times per token are printed (p50 / p99) and recorded in
build/test-results/grammar.json; nothing is asserted about them.

EXPLAINED (the only differences allowed):
  forced-bytes: where the grammar admits exactly one continuation for a
      while (llguidance's compute_ff_bytes() is not empty), llguidance allows
      only the tokens of its canonical tokenization of those bytes; kvant
      allows every token whose bytes fit the grammar (a prefix of the forced
      bytes, or the forced bytes and more).  Both languages are the same.
  digit-bound: llguidance allows a token that continues a run of digits
      past 16 (JSON leaves numbers unbounded); kvant bounds a number's
      integral part, fraction and exponent to 16 digits each, as llama.cpp's
      json-schema-to-grammar does (src/grammar/jschema.h), so that a model
      cannot spend its tokens on digits.  Only for JSON-schema walks.
"""
from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import jsonschema
import llguidance
import llguidance.gbnf_to_lark
import llguidance.numpy as lnp
import numpy as np
import pytest
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

STEPS = 40


@pytest.fixture(scope="module")
def vocab(kvant_bin, default_model):
    r = subprocess.run([kvant_bin, "grammar", "-m", default_model, "--vocab", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    v["bytes"] = [bytes.fromhex(h) for h in v["tokens"]]
    assert v["n_vocab"] == 49152
    return v


class _Wrapped:
    """The vocabulary as llguidance's TokenizerWrapper expects it; tokens
    with no bytes (control tokens) become named special tokens."""

    def __init__(self, v):
        self.eos_token_id = v["eos"][0]
        self.bos_token_id = None
        self.tokens = [b if b else b"<|special_%d|>" % i for i, b in enumerate(v["bytes"])]
        self.special_token_ids = [i for i, b in enumerate(v["bytes"]) if not b]
        self.index = {}
        for i, b in enumerate(v["bytes"]):
            if b and b not in self.index:
                self.index[b] = i

    def __call__(self, s):
        s = s.encode() if isinstance(s, str) else s
        out, i = [], 0
        while i < len(s):   # greedy longest match (llguidance uses it only for forced bytes)
            for n in range(min(48, len(s) - i), 0, -1):
                if s[i:i + n] in self.index:
                    out.append(self.index[s[i:i + n]])
                    i += n
                    break
            else:
                raise ValueError("untokenizable bytes")
        return out


@pytest.fixture(scope="module")
def lltok(vocab):
    return LLTokenizer(TokenizerWrapper(_Wrapped(vocab)), eos_token=vocab["eos"])


def _mask_set(hexmask: str, n_vocab: int) -> set[int]:
    words = np.frombuffer(bytes.fromhex(hexmask), dtype=">u4").astype(np.uint32)
    bits = np.unpackbits(words.view(np.uint8).reshape(-1, 4)[:, ::-1], bitorder="big")
    bits = bits.reshape(-1, 32)[:, ::-1].reshape(-1)[:n_vocab]
    return set(np.nonzero(bits)[0].tolist())


def _llg_set(m: LLMatcher, n_vocab: int) -> set[int]:
    bm = lnp.allocate_token_bitmask(1, n_vocab)
    lnp.fill_next_token_bitmask(m, bm)
    words = bm[0].view(np.uint32)
    bits = np.unpackbits(words.view(np.uint8).reshape(-1, 4)[:, ::-1], bitorder="big")
    bits = bits.reshape(-1, 32)[:, ::-1].reshape(-1)[:n_vocab]
    return set(np.nonzero(bits)[0].tolist())


class Kvant:
    """`kvant grammar --stdin`: one mask per line, token ids written back."""

    def __init__(self, kvant_bin, model, args):
        self.json = any(a.startswith("--schema") for a in args)  # a JSON-schema grammar
        self.p = subprocess.Popen([kvant_bin, "grammar", "-m", model, "--stdin", *args],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)

    def mask(self):
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError("kvant grammar ended: " + self.p.stderr.read())
        self.last = json.loads(line)
        return self.last

    def feed(self, tok):
        self.p.stdin.write(f"{tok}\n")
        self.p.stdin.flush()

    def close(self):
        try:
            self.p.stdin.write("-1\n")
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        self.p.wait(timeout=30)


def _structural(b: bytes) -> bool:
    return bool(b) and all(c in b'"{}[],:' for c in b)


def _draw(rng, allowed, v):
    eos = [t for t in allowed if t in v["eos"]]
    if eos and rng.random() < 0.5:
        return eos[0]
    st = [t for t in allowed if _structural(v["bytes"][t])]
    if st and rng.random() < 0.3:
        return rng.choice(st)
    return rng.choice(sorted(allowed))


def _explained(tok_bytes: bytes, ff: bytes) -> bool:
    return bool(ff) and (ff.startswith(tok_bytes) or tok_bytes.startswith(ff))


def _digit_bound(out: bytes, tok_bytes: bytes) -> bool:
    """The token would make a run of more than 16 digits (kvant's bound on a number)."""
    run = len(out) - len(out.rstrip(b"0123456789"))
    lead = len(tok_bytes) - len(tok_bytes.lstrip(b"0123456789"))
    return lead > 0 and run + lead > 16


def walk_compare(kvant_bin, model, vocab, lltok, args, llg_grammar, seed, times, diffs, kv=None):
    """One random walk; returns (output bytes, ended with EOS).  kv: a
    running `kvant grammar --stdin` to walk in (then left open, at a new
    sequence: its masks shared across sequences are under test)."""
    n = vocab["n_vocab"]
    m = LLMatcher(lltok, llg_grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    own = kv is None
    kv = Kvant(kvant_bin, model, args) if own else kv
    json_walk = kv.json
    rng = random.Random(seed)
    out = b""
    ended = False
    try:
        for step in range(STEPS):
            km = kv.mask()
            times.append(km["us"])
            ks = _mask_set(km["mask"], n)
            ls = _llg_set(m, n)
            ff = m.compute_ff_bytes()
            only_llg = ls - ks
            bound = {t for t in only_llg if json_walk and _digit_bound(out, vocab["bytes"][t])}
            if bound:
                diffs["digit-bound"] = diffs.get("digit-bound", 0) + len(bound)
            only_llg -= bound
            assert not only_llg, (f"step {step} after {out!r}: llguidance allows "
                                  f"{[vocab['bytes'][t] for t in sorted(only_llg)[:10]]}, kvant not")
            for t in ks - ls:
                assert _explained(vocab["bytes"][t], ff), (
                    f"step {step} after {out!r}: kvant allows {vocab['bytes'][t]!r}, "
                    f"llguidance not (forced bytes {ff!r})")
                diffs["forced-bytes"] = diffs.get("forced-bytes", 0) + 1
            both = ks & ls
            assert both, f"step {step} after {out!r}: no token allowed by both"
            tok = _draw(rng, both, vocab)
            if tok in vocab["eos"]:
                assert km["accepting"] and m.is_accepting()
                ended = True
                break
            assert m.consume_token(tok), m.get_error()
            kv.feed(tok)
            out += vocab["bytes"][tok]
    finally:
        if own:
            kv.close()
    if not own:   # the mask after the last token fed is unread; then a new sequence
        if not ended:
            kv.mask()
        kv.feed(-2)
    return out, ended


NO_WS = {"whitespace_flexible": False}

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
    "int-range": {"type": "array", "items": {"type": "integer", "minimum": -12, "maximum": 305},
                  "maxItems": 4},
}


def test_json_schema_masks_match_llguidance(kvant_bin, default_model, vocab, lltok, tmp_path,
                                            record_result):
    times, diffs, ended_n = [], {}, 0
    for name, schema in SCHEMAS.items():
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(schema))
        g = LLMatcher.grammar_from_json_schema(schema, overrides=NO_WS)
        for seed in range(3):
            out, ended = walk_compare(kvant_bin, default_model, vocab, lltok, ["--schema", str(f)],
                                      g, seed, times, diffs)
            if ended:
                ended_n += 1
                jsonschema.validate(json.loads(out), schema)
    p50, p99 = np.percentile(times, 50), np.percentile(times, 99)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "unknown CPU")
    print(f"\njson-schema walks on {cpu} (scalar C, one thread): {len(times)} masks over "
          f"{vocab['n_vocab']} tokens, p50 {p50:.0f} us, p99 {p99:.0f} us; {ended_n} outputs "
          f"validated; differences {diffs}")
    record_result("grammar", {"json_schema_mask_us_p50": p50, "json_schema_mask_us_p99": p99,
                              "masks": len(times), "validated": ended_n, "differences": diffs,
                              "cpu": cpu})
    assert ended_n >= 6


def test_shared_masks_across_sequences_match_llguidance(kvant_bin, default_model, vocab, lltok,
                                                         tmp_path):
    """Several walks in one process, so later sequences take masks from the
    cache shared across sequences (tmshare.h) where earlier ones walked the
    same states; every mask still equals llguidance's."""
    diffs, times, hits = {}, [], []
    for name in ("flat", "optional", "enum-array"):   # with strings: states worth sharing
        schema = SCHEMAS[name]
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(schema))
        g = LLMatcher.grammar_from_json_schema(schema, overrides=NO_WS)
        kv = Kvant(kvant_bin, default_model, ["--schema", str(f)])
        try:
            for seed in range(4):
                walk_compare(kvant_bin, default_model, vocab, lltok, [], g, 100 + seed, times,
                             diffs, kv=kv)
            hits.append(kv.mask()["shared_hits"])
        finally:
            kv.close()
    assert len(times) > 50 and all(h > 0 for h in hits), hits


# the last three nest repetitions of nullable bodies: kvant folds (x*)*, (x?)+, (x+)? ... into one
# repetition (a walk over the unfolded ((.*)*)*x ran past a minute); the masks must not change
REGEXES = ["[a-z]+@[a-z]+\\.(com|org)", "(\\+|-)?[0-9]{1,3}(\\.[0-9]+)?", "(ab|cd)*e?x{2,3}",
           "[^0-9\\n]{3}[0-9]", "((.*)*)*x", "((a?)*)+(b+)?c", "(((ab)?)+)*d"]


def test_regex_masks_match_llguidance(kvant_bin, default_model, vocab, lltok):
    times, diffs = [], {}
    for rx in REGEXES:
        g = LLMatcher.grammar_from_regex(rx)
        for seed in range(2):
            out, ended = walk_compare(kvant_bin, default_model, vocab, lltok, ["--regex", rx], g,
                                      seed, times, diffs)
            if ended:
                assert re.fullmatch(rx, out.decode()), (rx, out)


def test_choice_masks_match_llguidance(kvant_bin, default_model, vocab, lltok):
    choices = ["yes", "no", "maybe so", "yesterday"]
    lark = "start: " + " | ".join(json.dumps(c) for c in choices)
    times, diffs = [], {}
    for seed in range(4):
        out, ended = walk_compare(kvant_bin, default_model, vocab, lltok,
                                  ["--choice", json.dumps(choices)],
                                  LLMatcher.grammar_from_lark(lark), seed, times, diffs)
        assert ended and out.decode() in choices


GBNF_CASES = {
    "arith": 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"\n',
    "list": 'root ::= item{1,3}\nitem ::= "- " [a-z ]{1,8} "\\n"\n',
    "classes": 'root ::= [^a-z\\n"]{2} ("x" | [0-9]){0,2} "."  # comment\n',
}


@pytest.mark.parametrize("name", sorted(GBNF_CASES))
def test_gbnf_masks_match_llguidance(kvant_bin, default_model, vocab, lltok, tmp_path, name):
    src = GBNF_CASES[name]
    f = tmp_path / f"{name}.gbnf"
    f.write_text(src)
    g = LLMatcher.grammar_from_lark(llguidance.gbnf_to_lark.gbnf_to_lark(src))
    times, diffs = [], {}
    for seed in range(3):
        walk_compare(kvant_bin, default_model, vocab, lltok, ["--gbnf", str(f)], g, seed, times,
                     diffs)


PEER_GRAMMARS = Path("build/peer/llama.cpp/grammars")


@pytest.mark.parametrize("name", ["arithmetic", "c", "chess", "english", "japanese", "json",
                                  "json_arr", "list"])
def test_peer_gbnf_masks_match_llguidance(kvant_bin, default_model, vocab, lltok, name):
    """llama.cpp's own grammars (the peer's corpus), converted for llguidance
    by its gbnf_to_lark; one walk each."""
    f = PEER_GRAMMARS / f"{name}.gbnf"
    g = LLMatcher.grammar_from_lark(llguidance.gbnf_to_lark.gbnf_to_lark(f.read_text()))
    times, diffs = [], {}
    walk_compare(kvant_bin, default_model, vocab, lltok, ["--gbnf", str(f)], g, 1, times, diffs)


def test_peer_gbnf_corpus_compiles(kvant_bin, default_model):
    """Every grammar llama.cpp ships parses, and a short walk runs."""
    files = sorted(PEER_GRAMMARS.glob("*.gbnf"))
    assert len(files) >= 8
    for f in files:
        r = subprocess.run([kvant_bin, "grammar", "-m", default_model, "--gbnf", str(f),
                            "--steps", "3", "--json"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (f, r.stderr)
        j = json.loads(r.stdout)
        assert j["steps"][0]["n_allowed"] > 0, f


BAD = [
    (["--gbnf-text", 'root ::= "a" <[12]>'], "token references"),
    (["--gbnf-text", 'root ::= foo'], "undefined rule 'foo'"),
    (["--gbnf-text", 'rot ::= "a"'], "no rule named root"),
    (["--gbnf-text", 'root ::= "a" "\\q"'], "unknown escape"),
    (["--gbnf-text", 'root ::= "a"{3,1}'], "n < m"),
    (["--gbnf-text", 'root ::= x\nx ::= "a" x'], "can accept nothing"),
    (["--schema-text", '{"type":"object","properties":{"x":{"not":{}}}}'],
     "/properties/x/not: unsupported"),
    (["--schema-text", '{"type":"strin"}'], "unknown type 'strin'"),
    (["--schema-text", '{"$ref":"#/$defs/none"}'], "not found"),
    (["--schema-text", '{"type":'], "invalid JSON"),
    (["--regex", "(a"], "expecting ')'"),
    (["--regex", "(?=a)b"], "lookaround"),
    (["--regex", "a\\1"], "backreferences"),
    (["--regex", "a{5,2}"], "n < m"),
    (["--choice", "[1]"], "not a string"),
]


@pytest.mark.parametrize("args,msg", BAD, ids=[b[1] for b in BAD])
def test_bad_grammars_refused(kvant_bin, default_model, tmp_path, args, msg):
    if args[0].endswith("-text"):
        f = tmp_path / "g.txt"
        f.write_text(args[1])
        args = [args[0][:-5], str(f)]
    r = subprocess.run([kvant_bin, "grammar", "-m", default_model, *args, "--steps", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r
    assert msg in r.stderr, r.stderr


def test_grammar_size_limit(kvant_bin, default_model, tmp_path):
    f = tmp_path / "big.json"
    f.write_text(json.dumps({"type": "object", "properties": {
        f"p{i}": {"type": "string"} for i in range(200)}, "additionalProperties": False}))
    r = subprocess.run([kvant_bin, "grammar", "-m", default_model, "--schema", str(f),
                        "--steps", "0", "--max-elems", "2000"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "grammar too large" in r.stderr, r.stderr
