"""Tools end to end: rendering in the client's key order and tool-call parsing, through the real openai client.

The default model's own template (SmolLM2) ignores tools, so this module serves the default model with
`--chat-template` set to the real Qwen2.5 template (tests/templates/templates/qwen2_5.jinja; ChatML like
SmolLM2's, so the model's special tokens fit). The tool-call parser is then picked automatically (hermes).

A 135M model does not call tools on its own; the round-trip tests give it five earlier turns in which the
assistant called get_weather (as tool_calls messages, rendered by the template as <tool_call> markup) and
ask again (with three earlier turns it sometimes answers with a <tool_response> instead; with five it
called the tool for every city tried). Greedy decoding then copies the pattern and emits
<tool_call>{"name": "get_weather", "arguments": {"city": "Berlin"}}</tool_call>, which the server must
turn into message.tool_calls. This exercises the real path: template rendering of tool_calls and tool
messages, generation, parsing and the response shape.
"""
import json

import openai
import pytest
import requests

from conftest import MODEL_NAME as M, REPO, Server

TEMPLATE = REPO / "tests" / "templates" / "templates" / "qwen2_5.jinja"

# Keys deliberately out of sorted order at every level ("type" after "function", "required" before
# "properties", "city" after "unit"), so that sorting anywhere on the way would show.
TOOLS = [{
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "required": ["city"],
                       "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "city": {"type": "string"}}},
    },
    "type": "function",
}]


@pytest.fixture(scope="module")
def tools_server():
    s = Server("--chat-template", str(TEMPLATE))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def tclient(tools_server):
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def rendered_prompt(server, body):
    r = requests.post(server.url + "/tokenize", json=body, timeout=30)
    assert r.status_code == 200, r.text
    d = requests.post(server.url + "/detokenize", json={"tokens": r.json()["tokens"]}, timeout=30)
    assert d.status_code == 200, d.text
    return d.json()["prompt"]


def few_shot(city="Berlin"):
    msgs = []
    for i, c in enumerate(["Paris", "Rome", "Oslo", "Madrid", "Vienna"]):
        msgs += [
            {"role": "user", "content": f"What is the weather in {c}?"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": f"call_{i}", "type": "function",
                             "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "20 C"},
            {"role": "assistant", "content": f"It is 20 C in {c}."},
        ]
    msgs.append({"role": "user", "content": f"What is the weather in {city}?"})
    return msgs


def test_parser_picked_from_the_template(tools_server):
    assert "tool-call parser: hermes (auto" in tools_server.log_path.read_text(errors="replace")


def test_tools_rendered_in_the_clients_key_order(tools_server):
    text = rendered_prompt(tools_server, {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})
    # The template prints each tool with `tojson`, which (as in transformers) keeps the key order.
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text, text
    assert json.dumps(TOOLS[0], sort_keys=True) not in text
    assert "<tools>" in text and "<|im_start|>user\nhi<|im_end|>" in text


def test_tool_history_rendered_through_the_template(tools_server):
    text = rendered_prompt(tools_server, {"messages": few_shot(), "tools": TOOLS})
    # An assistant tool_calls message becomes hermes markup with the arguments as an object; a tool
    # message becomes a <tool_response> turn.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text, text
    assert "<tool_response>\n20 C\n</tool_response>" in text, text
    assert text.endswith("<|im_start|>assistant\n")


def test_tool_call_round_trip(tools_server, tclient):
    r = tclient.chat.completions.create(model=M, messages=few_shot(), tools=TOOLS, temperature=0, max_tokens=60)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content is None, ch
    assert len(ch.message.tool_calls) == 1, ch
    call = ch.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Berlin"}

    # Answer the call with a tool message; the conversation goes on (the reply is text or another call).
    msgs = few_shot() + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "12 C"},
    ]
    r2 = tclient.chat.completions.create(model=M, messages=msgs, tools=TOOLS, temperature=0, max_tokens=30)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_call_streaming(tools_server, tclient):
    stream = tclient.chat.completions.create(model=M, messages=few_shot(), tools=TOOLS, temperature=0,
                                             max_tokens=60, stream=True)
    content, calls, finish = "", {}, None
    for chunk in stream:
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            finish = ch.finish_reason or finish
    assert finish == "tool_calls"
    assert "<tool_call>" not in content and "</tool_call>" not in content, content
    assert list(calls) == [0]
    assert calls[0]["id"].startswith("call_")
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Berlin"}


def test_tool_choice_none_leaves_the_text(tools_server, tclient):
    r = tclient.chat.completions.create(model=M, messages=few_shot(), tools=TOOLS, tool_choice="none",
                                        temperature=0, max_tokens=60)
    ch = r.choices[0]
    assert not ch.message.tool_calls
    assert ch.finish_reason == "stop"
    assert "<tool_call>" in ch.message.content  # the same greedy output, not parsed


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_choice_needing_constrained_decoding_is_400(tools_server, tclient, choice):
    with pytest.raises(openai.BadRequestError) as e:
        tclient.chat.completions.create(model=M, messages=few_shot(), tools=TOOLS, tool_choice=choice,
                                        max_tokens=5)
    assert e.value.status_code == 400
    assert "constrained decoding" in str(e.value)


def test_no_parsing_without_tools(server, client):
    # The default model's template has no tool markup: auto picks no parser, and text is text.
    assert "tool-call parser: none (auto" in server.log_path.read_text(errors="replace")
    r = client.chat.completions.create(model=M, messages=[{"role": "user", "content": "Hi"}], tools=TOOLS,
                                       max_tokens=8, temperature=0)
    assert r.choices[0].message.tool_calls in (None, [])
    assert isinstance(r.choices[0].message.content, str)


def test_bad_chat_template_file_fails_start(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(RuntimeError, match="does not compile"):
        Server("--chat-template", str(bad))
