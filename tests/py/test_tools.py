"""Tool calling through `kvant serve` with the official openai client: tool_choice required and
named constrain the output to the functions' parameter schemas (every call's arguments validate
with `jsonschema`, finish_reason "tool_calls"), streaming and not; auto parses Hermes / Qwen
`<tool_call>` blocks (forced here with a GBNF grammar, since the small default model never
writes one by itself); none returns text; a two-round conversation (the assistant's tool_calls
and the tool's result sent back) is accepted; bad tool requests are 400s naming the field.
The default model's chat template ignores `tools` (it has no tool syntax), so what the model
sees is the plain conversation: the constraint alone makes the calls valid."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from server_util import module_openai_client, module_server

MODEL = "SmolLM2-135M-Instruct.Q4_1"

srv = module_server()
client = module_openai_client(timeout=300)

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMA = {"get_weather": WEATHER, "add": ADD}
MSGS = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]


def merge_delta(msg: dict, delta: dict) -> None:
    """A streamed delta into the message so far, as a client accumulates it: content is
    concatenated, the rest replaced."""
    for k, v in delta.items():
        if k == "content" and v is not None:
            msg["content"] = (msg.get("content") or "") + v
        elif v is not None:
            msg[k] = v


def check_calls(msg, names=None):
    assert msg.tool_calls, msg
    for c in msg.tool_calls:
        assert c.type == "function" and c.id
        assert c.function.name in (names or SCHEMA)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMA[c.function.name])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required(client, seed):
    r = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS,
                                       tool_choice="required", max_tokens=300,
                                       temperature=1.0, seed=seed)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content is None
    check_calls(ch.message)


def test_required_not_parallel(client):
    r = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS,
                                       tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=300, temperature=1.0, seed=4)
    assert len(r.choices[0].message.tool_calls) == 1
    check_calls(r.choices[0].message)


def test_named(client):
    for seed in (1, 2):
        r = client.chat.completions.create(
            model=MODEL, messages=MSGS, tools=TOOLS, max_tokens=200, temperature=1.0, seed=seed,
            tool_choice={"type": "function", "function": {"name": "add"}})
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls"
        assert [c.function.name for c in ch.message.tool_calls] == ["add"]
        check_calls(ch.message, ["add"])


def test_stream_equals_non_stream(client):
    kw = dict(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=300,
              temperature=0)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    fins = [ch.choices[0].finish_reason for ch in chunks if ch.choices and
            ch.choices[0].finish_reason]
    assert fins == ["tool_calls"]
    assert [(c.function.name, c.function.arguments) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in full.choices[0].message.tool_calls]


def test_auto_parses_hermes_blocks(srv):
    """auto: the reply's <tool_call> blocks become tool_calls and the rest is the content (the
    output is forced by a GBNF grammar, which auto leaves free to use)."""
    g = (r'root ::= "Sure. <tool_call>{\"name\": \"add\", \"arguments\": {\"a\": " [1-9] '
         r'", \"b\": 4}}</tool_call>"')
    for stream in (False, True):
        body = {"model": MODEL, "messages": MSGS, "tools": TOOLS, "tool_choice": "auto",
                "max_tokens": 100, "grammar": g, "stream": stream}
        if not stream:
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            ch = r.json()["choices"][0]
            msg, fin = ch["message"], ch["finish_reason"]
        else:
            msg, fin = {}, None
            with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body,
                              timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        c = json.loads(line[6:])["choices"][0]
                        merge_delta(msg, c["delta"])
                        fin = c["finish_reason"] or fin
        assert fin == "tool_calls", msg
        assert msg["content"] == "Sure. "
        (call,) = msg["tool_calls"]
        assert call["function"]["name"] == "add"
        args = json.loads(call["function"]["arguments"])
        assert args["b"] == 4 and 1 <= args["a"] <= 9


def gbnf_literal(text: str) -> str:
    return 'root ::= "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def auto_reply(srv, text: str, stream: bool):
    """The reply message and finish reason of tool_choice auto when the output is forced to
    text (a GBNF literal)."""
    body = {"model": MODEL, "messages": MSGS, "tools": TOOLS, "tool_choice": "auto",
            "max_tokens": 200, "grammar": gbnf_literal(text), "stream": stream}
    if not stream:
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        return ch["message"], ch["finish_reason"]
    msg, fin = {}, None
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                c = json.loads(line[6:])["choices"][0]
                merge_delta(msg, c["delta"])
                fin = c["finish_reason"] or fin
    msg.setdefault("content", None)
    return msg, fin


ADD_24 = ("add", {"a": 2, "b": 4})
PARIS = ("get_weather", {"city": "Paris", "unit": "c"})


@pytest.mark.parametrize("text, content, calls", [
    # Llama 3.x JSON calls: the whole reply, "parameters" for the arguments, ';' between calls
    ('{"name": "add", "parameters": {"a": 2, "b": 4}}', None, [ADD_24]),
    ('<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 4}}; '
     '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}', None,
     [ADD_24, PARIS]),
    # Mistral v3: [TOOL_CALLS] and a JSON array; the text before is the content
    ('Checking. [TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 4}}, '
     '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]', "Checking. ",
     [ADD_24, PARIS]),
    # Mistral v11+: [TOOL_CALLS]name[ARGS]{...} per call ([CALL_ID] allowed)
    ('[TOOL_CALLS]add[ARGS]{"a": 2, "b": 4}[TOOL_CALLS]get_weather[CALL_ID]c1[ARGS]'
     '{"city": "Paris", "unit": "c"}', None, [ADD_24, PARIS]),
    # not calls of the given tools: the text as written is the content
    ('{"name": "nope", "parameters": {"a": 1}}', '{"name": "nope", "parameters": {"a": 1}}',
     []),
    ('[TOOL_CALLS]nope[ARGS]{"a": 1}', '[TOOL_CALLS]nope[ARGS]{"a": 1}', []),
    ('Two is {"name": "add"}', 'Two is {"name": "add"}', []),
])
@pytest.mark.parametrize("stream", [False, True])
def test_auto_parses_each_family(srv, text, content, calls, stream):
    msg, fin = auto_reply(srv, text, stream)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
           for c in msg.get("tool_calls") or []]
    assert got == calls, msg
    assert msg["content"] == content, msg
    assert fin == ("tool_calls" if calls else "stop"), (fin, msg)
    for name, args in got:
        jsonschema.validate(args, SCHEMA[name])
    assert len({c["id"] for c in msg.get("tool_calls") or []}) == len(calls)


def test_stream_content_comes_before_the_end(srv):
    """Streaming with tools: content that no call can start in is sent as it comes (several
    chunks before the last), a call's bytes never appear as content, and the calls come in the
    final delta."""
    for text, n_calls in (("Paris is sunny and warm today, at about twenty degrees.", 0),
                          ('Let me check the numbers first. <tool_call>{"name": "add", '
                           '"arguments": {"a": 2, "b": 4}}</tool_call>', 1)):
        body = {"model": MODEL, "messages": MSGS, "tools": TOOLS, "tool_choice": "auto",
                "max_tokens": 200, "grammar": gbnf_literal(text), "stream": True}
        chunks = []
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body,
                          timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:])["choices"][0])
        assert chunks[0]["delta"].get("role") == "assistant"
        assert sum("role" in c["delta"] for c in chunks) == 1
        content = [i for i, c in enumerate(chunks) if c["delta"].get("content")]
        assert len(content) >= 3, chunks  # not held to the end
        assert content[0] < len(chunks) - 3
        calls = [c for c in chunks if c["delta"].get("tool_calls")]
        assert len(calls) == (1 if n_calls else 0) and all(c is chunks[-2] for c in calls)
        msg = {}
        for c in chunks:
            merge_delta(msg, c["delta"])
        assert "<tool_call>" not in msg["content"]
        assert msg["content"] == (text if not n_calls else "Let me check the numbers first. ")


def test_auto_and_none_return_text(client):
    for tc in ("auto", "none"):
        r = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS,
                                           tool_choice=tc, max_tokens=24, temperature=0)
        ch = r.choices[0]
        assert ch.message.content and not ch.message.tool_calls
        assert ch.finish_reason in ("stop", "length")


def test_two_rounds(client):
    """The assistant's calls and the tool's results go back to the model (rendered by its
    template) and the conversation goes on."""
    first = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS,
                                           tool_choice="required", max_tokens=300, seed=7,
                                           temperature=1.0)
    msg = first.choices[0].message
    check_calls(msg)
    msgs = MSGS + [msg.model_dump(exclude_none=True)]
    for c in msg.tool_calls:
        msgs.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps({"ok": 1})})
    second = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                            max_tokens=16, temperature=0)
    assert second.choices[0].message.content
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


BAD = [
    ("tool_choice unknown name", {"tools": TOOLS, "tool_choice": {"type": "function",
                                                                  "function": {"name": "nope"}}},
     "tool_choice", "nope"),
    ("tool_choice without tools", {"tool_choice": "required"}, "tool_choice", "tools"),
    ("tool_choice bad string", {"tools": TOOLS, "tool_choice": "always"}, "tool_choice",
     "always"),
    ("tools not functions", {"tools": [{"type": "retrieval"}]}, "tools", "function"),
    ("tool name twice", {"tools": [TOOLS[1], TOOLS[1]]}, "tools", "twice"),
    ("parameters not a schema", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"not": {}}}}}}],
        "tool_choice": "required"}, "tool_choice", "/not"),
    ("required and response_format", {"tools": TOOLS, "tool_choice": "required",
                                      "response_format": {"type": "json_object"}},
     "tool_choice", "response_format"),
    ("parallel_tool_calls not bool", {"tools": TOOLS, "parallel_tool_calls": 1},
     "parallel_tool_calls", "boolean"),
    ("functions (legacy)", {"functions": [TOOLS[1]["function"]]}, "functions", "tools"),
    ("tool message without a call id type", {"messages": MSGS + [
        {"role": "tool", "tool_call_id": 5, "content": "x"}]}, "messages", "tool_call_id"),
    ("tool_calls on a user message", {"messages": [{"role": "user", "content": "x",
                                                    "tool_calls": []}]}, "messages",
     "assistant"),
    ("tool_calls arguments not JSON", {"messages": MSGS + [
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "add", "arguments": "{nope"}}]}]}, "messages", "arguments"),
]


@pytest.mark.parametrize("name,extra,param,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_tool_requests(srv, name, extra, param, needle):
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 4, **extra}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err
