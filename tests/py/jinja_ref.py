"""Reference chat-template rendering: Python jinja2 with transformers' semantics, and the
conversations tests/py/test_jinja.py renders every template of llama.cpp's corpus with.

The environment is the one transformers' apply_chat_template builds
(transformers/utils/chat_template_utils.py): ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]), tojson =
json.dumps(ensure_ascii=False, ...), raise_exception, strftime_now; render(messages=...,
tools=None or [...], documents=None, add_generation_prompt=..., bos_token, eos_token).
strftime_now formats FIXED_TIME in UTC: kvant gets the same through KVANT_TEMPLATE_TIME and TZ.
"""
from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_TIME = 1764547200  # 2025-12-01 00:00:00 UTC


class RaisedError(Exception):
    """raise_exception(msg) in a template."""


class _Generation(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise(message):
    raise RaisedError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.fromtimestamp(FIXED_TIME, tz=timezone.utc).strftime(fmt)


def environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


def render(source: str, messages, tools, add_generation_prompt: bool, bos: str, eos: str) -> str:
    """The prompt, or raises (jinja2's own errors, RaisedError)."""
    tpl = environment().from_string(source)
    return tpl.render(messages=messages, tools=tools, documents=None,
                      add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos)


def kvant_env() -> dict:
    env = dict(os.environ)
    env["KVANT_TEMPLATE_TIME"] = str(FIXED_TIME)
    env["TZ"] = "UTC"
    return env


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name (\u00e9 ok)"},
                "unit": {"type": "string", "description": "Temperature unit", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}]

# (name, messages, tools, add_generation_prompt)
CONVERSATIONS = [
    ("system_user", [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Hello! What's 2+2?"},
    ], None, True),
    ("multi_turn", [
        {"role": "user", "content": "  Hi there!\n"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Tell me a joke about \"quotes\" and caf\u00e9s."},
    ], None, True),
    ("multi_turn_no_gen", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Ping"},
        {"role": "assistant", "content": "Pong"},
    ], None, False),
    ("no_system", [
        {"role": "user", "content": "Write one word."},
    ], None, True),
    ("tools", [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Z\u00fcrich?"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "a1b2c3d4e", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Z\u00fcrich", "unit": "celsius"}},
        }]},
        {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": "{\"temp\": 18}"},
    ], TOOLS, True),
    ("tools_offered", [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Hi"},
    ], TOOLS, True),
]


def _settz():
    os.environ["TZ"] = "UTC"
    if hasattr(time, "tzset"):
        time.tzset()


_settz()
