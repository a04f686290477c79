"""LangChain's ChatOpenAI (langchain-openai, pinned in tests/requirements.txt) against
`kvant serve` on the default model: invoke, stream and batch give the server's own answers
(the same text as the official openai client at temperature 0), max_tokens / temperature /
stop / seed are honoured, every field LangChain puts in its requests is one kvant honours
(recorded off the wire and checked field by field), with_structured_output(json_schema) returns
the Pydantic object (structured outputs), and so does with_structured_output(function_calling)
(tool calling with a named function)."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from server_util import module_openai_client, module_server

MODEL = "SmolLM2-135M-Instruct.Q4_1"
Q = "Name three colours."
PROMPTS = ["Name three colours.", "What is 2+2?", "Say hello in French.",
           "Name a planet."]

srv = module_server()
client = module_openai_client()


class Recorder:
    """An httpx client for LangChain that keeps every request body it sends."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.http = httpx.Client(timeout=120, event_hooks={"request": [self.hook]})

    def hook(self, req: httpx.Request):
        if req.content:
            self.bodies.append(json.loads(req.content))


def lc(srv, rec: Recorder | None = None, **kw) -> ChatOpenAI:
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    return ChatOpenAI(base_url=srv.url + "/v1", api_key="x", model=MODEL, max_retries=0,
                      http_client=rec.http if rec else None, **kw)


def raw(client, content: str, **kw) -> openai.types.chat.ChatCompletion:
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def test_invoke_is_the_servers_answer(srv, client):
    rec = Recorder()
    msg = lc(srv, rec).invoke(Q)
    ref = raw(client, Q)
    assert msg.content == ref.choices[0].message.content
    assert msg.content.strip(), "empty answer"
    # usage and finish reason come through LangChain unchanged
    assert msg.usage_metadata["input_tokens"] == ref.usage.prompt_tokens
    assert msg.usage_metadata["output_tokens"] == ref.usage.completion_tokens
    assert msg.response_metadata["finish_reason"] == ref.choices[0].finish_reason
    assert msg.response_metadata["model_name"] == MODEL
    # LangChain's default request: every field in it is one kvant implements
    body = rec.bodies[-1]
    assert set(body) == {"model", "messages", "stream", "temperature",
                         "max_completion_tokens"}, body
    assert body["stream"] is False and body["max_completion_tokens"] == 24


def test_max_tokens_is_honoured(srv, client):
    msg = lc(srv, max_tokens=3).invoke(Q)
    assert msg.usage_metadata["output_tokens"] == 3
    assert msg.response_metadata["finish_reason"] == "length"
    assert msg.content == raw(client, Q, max_tokens=3).choices[0].message.content


def test_system_message_and_developer_role(srv, client):
    msgs = [SystemMessage("Answer in one word."), HumanMessage("Capital of France?")]
    got = lc(srv).invoke(msgs).content
    ref = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=24,
        messages=[{"role": "system", "content": "Answer in one word."},
                  {"role": "user", "content": "Capital of France?"}])
    assert got == ref.choices[0].message.content


def test_stream_concatenates_to_invoke(srv):
    rec = Recorder()
    llm = lc(srv, rec, stream_usage=True)
    whole = llm.invoke(Q)
    chunks = list(llm.stream(Q))
    assert len(chunks) > 2, "one chunk: not streamed"
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    text = "".join(c.content for c in chunks)
    assert text == whole.content
    # stream_options.include_usage is honoured: the usage chunk LangChain asked for
    total = chunks[0]
    for c in chunks[1:]:
        total += c
    assert total.usage_metadata is not None, "include_usage sent but no usage chunk"
    assert total.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]
    assert total.usage_metadata["input_tokens"] == whole.usage_metadata["input_tokens"]
    body = rec.bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_batch_matches_one_by_one(srv, client):
    llm = lc(srv, max_tokens=12)
    outs = llm.batch(PROMPTS, config={"max_concurrency": 4})
    assert len(outs) == len(PROMPTS)
    for p, o in zip(PROMPTS, outs):
        assert o.content == raw(client, p, max_tokens=12).choices[0].message.content, p
    assert len({o.content for o in outs}) > 1, "every prompt gave the same answer"


def test_stop_is_honoured(srv, client):
    full = raw(client, Q, max_tokens=24).choices[0].message.content
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    rec = Recorder()
    msg = lc(srv, rec, stop=[stop]).invoke(Q)
    assert stop not in msg.content
    assert full.startswith(msg.content) and len(msg.content) < len(full)
    assert msg.response_metadata["finish_reason"] == "stop"
    assert rec.bodies[-1]["stop"] == [stop]


def test_temperature_and_seed(srv):
    rec = Recorder()
    a = lc(srv, rec, temperature=1.0, seed=7).invoke(Q).content
    b = lc(srv, temperature=1.0, seed=7).invoke(Q).content
    assert a == b, "same seed, different answers"
    others = {lc(srv, temperature=1.0, seed=s).invoke(Q).content for s in (1, 2, 3, 4)}
    assert len(others | {a}) > 1, "temperature 1.0 with five seeds gave one answer"
    assert rec.bodies[-1]["temperature"] == 1.0 and rec.bodies[-1]["seed"] == 7


def test_out_of_range_temperature_is_a_clear_400(srv):
    with pytest.raises(openai.BadRequestError) as ei:
        lc(srv, temperature=2.5).invoke(Q)
    assert "temperature" in str(ei.value)


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


def test_structured_output_function_calling(srv):
    """tools + tool_choice naming the function: the arguments are constrained to its schema."""
    rec = Recorder()
    out = lc(srv, rec, max_tokens=200).with_structured_output(Person, method="function_calling") \
        .invoke("Alice is 30.")
    assert isinstance(out, Person), out
    assert rec.bodies[-1]["tool_choice"]["function"]["name"] == "Person"


def test_structured_output_json_schema(srv):
    """response_format json_schema (strict): the garbage model's answer is still a Person."""
    rec = Recorder()
    out = lc(srv, rec, max_tokens=200).with_structured_output(Person, method="json_schema") \
        .invoke("Alice is 30.")
    assert isinstance(out, Person), out
    assert rec.bodies[-1]["response_format"]["type"] == "json_schema"
