"""Chat templates through kvant's Jinja interpreter against Python jinja2.

test_corpus: every template of llama.cpp's corpus (build/peer/llama.cpp/models/templates/*.jinja,
`make peer-src`), rendered over jinja_ref.CONVERSATIONS (system + user, multi-turn, no
generation prompt, no system, assistant tool_calls and a tool result with tools given) by
jinja2 3.1.6 with transformers' semantics (tests/py/jinja_ref.py) and by `kvant template
--chat-template FILE -m <default model>` (BOS/EOS from that model, passed to jinja2 too;
strftime_now pinned by KVANT_TEMPLATE_TIME and TZ=UTC).  Each template must be byte-equal on
every conversation jinja2 renders, fail where jinja2 fails (with raise_exception's message), or
be refused by kvant when it compiles the template, naming the construct.  Asserts 0 wrong and
>= 90% equal, and prints the counts (also in build/test-results/jinja.json).

Also: `kvant template` options and errors, POST /apply-template, and the default model's own
chat prompt (the same bytes as the native ChatML renderer that the interpreter replaced).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess

import gguf
import httpx
import pytest

import jinja_ref
from server_util import KvantServer

TEMPLATES = sorted(glob.glob("build/peer/llama.cpp/models/templates/*.jinja"))
QWEN = "build/peer/llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"

# What the native ChatML renderer (before the interpreter) produced for the default model's
# template; also jinja2's rendering (tests/unit/test_chat.c holds the same strings).
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def model_tokens(path):
    r = gguf.GGUFReader(path)
    toks = r.fields["tokenizer.ggml.tokens"]

    def text(key):
        i = int(r.fields[key].parts[-1][0])
        return bytes(toks.parts[toks.data[i]]).decode("utf-8")

    f = r.fields["tokenizer.chat_template"]
    return text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id"), \
        bytes(f.parts[f.data[0]]).decode("utf-8")


def kvant_template(kvant_bin, model, tmp_path, messages, tools=None, agp=True, template=None,
                   extra=()):
    mf = tmp_path / "messages.json"
    mf.write_text(json.dumps(messages), encoding="utf-8")
    cmd = [kvant_bin, "template", "-m", model, "--messages", str(mf), *extra]
    if tools is not None:
        tf = tmp_path / "tools.json"
        tf.write_text(json.dumps(tools), encoding="utf-8")
        cmd += ["--tools", str(tf)]
    if agp:
        cmd.append("--add-generation-prompt")
    if template:
        cmd += ["--chat-template", template]
    return subprocess.run(cmd, capture_output=True, env=jinja_ref.kvant_env(), timeout=60)


def classify(kvant_bin, model, tmp_path, path, bos, eos):
    """'equal' | 'refused' | 'wrong', and notes."""
    src = open(path, encoding="utf-8").read()
    notes = []
    for name, msgs, tools, agp in jinja_ref.CONVERSATIONS:
        try:
            want, werr = jinja_ref.render(src, msgs, tools, agp, bos, eos), None
        except jinja_ref.RaisedError as e:
            want, werr = None, ("raised", str(e))
        except Exception as e:  # jinja2's own error: kvant must fail too
            want, werr = None, ("error", f"{type(e).__name__}: {e}")
        p = kvant_template(kvant_bin, model, tmp_path, msgs, tools, agp, template=path)
        kerr = p.stderr.decode("utf-8", "replace").strip()
        if p.returncode == 0:
            got = p.stdout.decode("utf-8")
            if want is not None and got == want:
                continue
            notes.append(f"{name}: kvant rendered, jinja2 {'differs' if want is not None else werr}")
            return "wrong", notes
        if "unsupported" in kerr:
            return "refused", [kerr]
        if want is not None:
            notes.append(f"{name}: jinja2 rendered, kvant failed: {kerr}")
            return "wrong", notes
        if werr[0] == "raised" and werr[1] not in kerr:
            notes.append(f"{name}: raise_exception({werr[1]!r}) but kvant said {kerr}")
            return "wrong", notes
        notes.append(f"{name}: both fail ({werr[0]}: {werr[1][:80]})")
    return "equal", notes


def test_corpus(kvant_bin, default_model, tmp_path, results_dir):
    assert len(TEMPLATES) >= 70, f"llama.cpp's template corpus missing (make peer-src): {TEMPLATES}"
    bos, eos, _ = model_tokens(default_model)
    counts = {"equal": 0, "refused": 0, "wrong": 0}
    detail = {}
    for path in TEMPLATES:
        status, notes = classify(kvant_bin, default_model, tmp_path, path, bos, eos)
        counts[status] += 1
        detail[os.path.basename(path)] = {"status": status, "notes": notes}
    print(f"\nchat templates: {len(TEMPLATES)}: equal {counts['equal']}, refused {counts['refused']}, "
          f"wrong {counts['wrong']}")
    both = sum(len(v["notes"]) for v in detail.values() if v["status"] == "equal")
    vacuous = [k for k, v in detail.items() if len(v["notes"]) == len(jinja_ref.CONVERSATIONS)]
    print(f"  equal templates that jinja2 renders for no conversation (checked only in failing): {vacuous}")
    print(f"  (template, conversation) pairs: {len(TEMPLATES) * len(jinja_ref.CONVERSATIONS)}, "
          f"of which jinja2 and kvant both fail: {both}")
    for k, v in detail.items():
        if v["status"] != "equal" or v["notes"]:
            print(f"  {v['status']}: {k}: {'; '.join(v['notes'])}")
    (results_dir / "jinja.json").write_text(json.dumps({"counts": counts, "templates": detail}, indent=1))
    assert counts["wrong"] == 0, {k: v for k, v in detail.items() if v["status"] == "wrong"}
    assert counts["equal"] >= 0.9 * len(TEMPLATES), counts


def test_default_model_prompt(kvant_bin, default_model, tmp_path):
    """The default model's GGUF template renders what the native renderer did, and jinja2."""
    bos, eos, src = model_tokens(default_model)
    msgs = [{"role": "user", "content": "hi"}]
    p = kvant_template(kvant_bin, default_model, tmp_path, msgs)
    assert p.returncode == 0, p.stderr
    native = (f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert p.stdout.decode() == native
    assert p.stdout.decode() == jinja_ref.render(src, msgs, None, True, bos, eos)
    full = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Hi there!\n"},
            {"role": "assistant", "content": "Hello. \u00a0"}, {"role": "user", "content": "What is 2+2?"}]
    p = kvant_template(kvant_bin, default_model, tmp_path, full, agp=False, extra=["--json"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"prompt": jinja_ref.render(src, full, None, False, bos, eos)}


def test_template_cli_errors(kvant_bin, default_model, tmp_path):
    p = subprocess.run([kvant_bin, "template", "-m", default_model], capture_output=True, timeout=60)
    assert p.returncode == 2 and b"--messages" in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    p = subprocess.run([kvant_bin, "template", "-m", default_model, "--messages", str(bad)],
                       capture_output=True, timeout=60)
    assert p.returncode == 1 and b"bad.json" in p.stderr
    tpl = tmp_path / "call.jinja"
    tpl.write_text("line one\n{% call x() %}{% endcall %}")
    p = kvant_template(kvant_bin, default_model, tmp_path, [{"role": "user", "content": "x"}],
                       template=str(tpl))
    assert p.returncode == 1 and b"unsupported tag 'call' at line 2" in p.stderr, p.stderr
    tpl.write_text("{{ raise_exception('no ' ~ messages[0].role) }}")
    p = kvant_template(kvant_bin, default_model, tmp_path, [{"role": "user", "content": "x"}],
                       template=str(tpl))
    assert p.returncode == 1 and b"no user" in p.stderr, p.stderr


@pytest.fixture(scope="module")
def qwen_server(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model, "--chat-template", QWEN, env=jinja_ref.kvant_env())
    yield s
    assert s.stop() == 0, s.log_text()


def test_apply_template(qwen_server, default_model):
    bos, eos, _ = model_tokens(default_model)
    src = open(QWEN, encoding="utf-8").read()
    url = qwen_server.url + "/apply-template"
    for name, msgs, tools, agp in jinja_ref.CONVERSATIONS:
        body = {"messages": msgs}
        if tools:
            body["tools"] = tools
        if not agp:
            body["add_generation_prompt"] = False  # absent: true
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 200, (name, r.text)
        assert r.json() == {"prompt": jinja_ref.render(src, msgs, tools, agp, bos, eos)}, name
    bad = [({"messages": [{"role": "user", "content": "x"}], "stream": True}, "stream"),
           ({"messages": []}, "messages"),
           ({"messages": [{"content": "x"}]}, "messages"),
           ({"messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools"),
           ({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"},
            "add_generation_prompt")]
    for body, param in bad:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    # a chat request with tools: the template renders them into the prompt
    usage = []
    for extra in ({}, {"tools": jinja_ref.TOOLS, "tool_choice": "none"}):
        r = httpx.post(qwen_server.url + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                             **extra})
        assert r.status_code == 200, r.text
        usage.append(r.json()["usage"]["prompt_tokens"])
    assert usage[1] > usage[0] + 20, usage


def test_run_chat_template(kvant_bin, default_model, tmp_path):
    """kvant run --chat --chat-template FILE feeds the model that template's prompt."""
    tpl = tmp_path / "t.jinja"
    tpl.write_text("<|im_start|>user {{ messages[0].content | upper }}<|im_end|>{{ eos_token }}")
    p = subprocess.run([kvant_bin, "run", "-m", default_model, "-t", "2", "--chat", "--chat-template", str(tpl),
                        "-p", "hello there", "-n", "1", "--temp", "0", "--json"],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    ids = json.loads(p.stdout)["token_ids"]
    want = subprocess.run([kvant_bin, "tokenize", "-m", default_model, "--parse-special", "--json", "-p",
                           "<|im_start|>user HELLO THERE<|im_end|><|im_end|>"], capture_output=True, timeout=60)
    assert want.returncode == 0, want.stderr
    prompt = json.loads(want.stdout)
    assert ids[:len(prompt)] == prompt and len(ids) == len(prompt) + 1
    p = subprocess.run([kvant_bin, "run", "-m", default_model, "--chat-template", str(tpl), "-p", "x"],
                       capture_output=True, timeout=60)
    assert p.returncode == 2 and b"--chat-template needs --chat" in p.stderr


def test_refused_template_server(kvant_bin, default_model, tmp_path):
    """A template kvant refuses: the model still loads and completes; chat requests get a 400
    naming the construct (and so does /apply-template)."""
    tpl = tmp_path / "refused.jinja"
    tpl.write_text("{% for m in messages %}\n{{ m.content | wordwrap(10) }}{% endfor %}")
    s = KvantServer(kvant_bin, default_model, "--chat-template", str(tpl))
    try:
        chat = httpx.post(s.url + "/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert chat.status_code == 400 and "unsupported filter 'wordwrap' at line 2" in chat.text, chat.text
        r = httpx.post(s.url + "/apply-template", json={"messages": [{"role": "user", "content": "x"}]},
                       timeout=30)
        assert r.status_code == 400 and "wordwrap" in r.text, r.text
        comp = httpx.post(s.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
        assert comp.status_code == 200, comp.text
        assert "refused" in s.log_text() and "wordwrap" in s.log_text()
    finally:
        assert s.stop() == 0, s.log_text()
