"""Hostile and malformed input: each case gets the right status and an OpenAI
error object, and a normal request right after still succeeds."""
import json
import socket
import time

import pytest
import requests

from conftest import MODEL_NAME as M

MSG = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return {"model": M, "messages": MSG, "max_tokens": 1, **kw}


def comp(**kw):
    return {"model": M, "prompt": "hi", "max_tokens": 1, **kw}


def raw(s):
    return s.encode() if isinstance(s, str) else s


CHAT = "/v1/chat/completions"
COMP = "/v1/completions"

# (id, method, path, body: dict (JSON) or bytes/str (raw), expected status, expected param or None)
CASES = [
    ("malformed_json", "POST", CHAT, "{bad json", 400, None),
    ("truncated_json", "POST", CHAT, '{"model": "' + M + '", "messages": [{"role": "us', 400, None),
    ("empty_body", "POST", CHAT, "", 400, None),
    ("array_root", "POST", CHAT, "[1, 2]", 400, None),
    ("string_root", "POST", CHAT, '"hello"', 400, None),
    ("trailing_garbage", "POST", CHAT, json.dumps(chat()) + " }", 400, None),
    ("missing_model", "POST", CHAT, {"messages": MSG}, 400, "model"),
    ("unknown_model", "POST", CHAT, chat(model="gpt-4o"), 404, "model"),
    ("model_wrong_type", "POST", CHAT, chat(model=5), 400, "model"),
    ("missing_messages", "POST", CHAT, {"model": M}, 400, "messages"),
    ("messages_not_array", "POST", CHAT, chat(messages="hi"), 400, "messages"),
    ("messages_empty", "POST", CHAT, chat(messages=[]), 400, "messages"),
    ("message_without_role", "POST", CHAT, chat(messages=[{"content": "x"}]), 400, "messages[0].role"),
    ("message_unknown_role", "POST", CHAT, chat(messages=[{"role": "god", "content": "x"}]), 400, "messages[0].role"),
    ("content_wrong_type", "POST", CHAT, chat(messages=[{"role": "user", "content": 42}]), 400, "messages[0].content"),
    ("image_part", "POST", CHAT,
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400, None),
    ("temperature_string", "POST", CHAT, chat(temperature="hot"), 400, "temperature"),
    ("temperature_negative", "POST", CHAT, chat(temperature=-0.5), 400, "temperature"),
    ("temperature_huge", "POST", CHAT, chat(temperature=1e300), 400, "temperature"),
    ("number_overflow", "POST", CHAT, '{"model": "' + M + '", "messages": [], "temperature": 1e999}', 400, None),
    ("top_p_above_one", "POST", CHAT, chat(top_p=2), 400, "top_p"),
    ("max_tokens_zero", "POST", CHAT, chat(max_tokens=0), 400, "max_tokens"),
    ("max_tokens_negative", "POST", CHAT, chat(max_tokens=-5), 400, "max_tokens"),
    ("max_tokens_huge", "POST", CHAT, chat(max_tokens=10**12), 400, "max_tokens"),
    ("max_tokens_over_context", "POST", CHAT, chat(max_tokens=5000), 400, None),
    ("max_tokens_string", "POST", CHAT, chat(max_tokens="10"), 400, "max_tokens"),
    ("n_zero", "POST", CHAT, chat(n=0), 400, "n"),
    ("n_huge", "POST", CHAT, chat(n=10**6), 400, "n"),
    ("top_logprobs_huge", "POST", CHAT, chat(logprobs=True, top_logprobs=1000), 400, "top_logprobs"),
    ("top_logprobs_without_logprobs", "POST", CHAT, chat(top_logprobs=2), 400, "top_logprobs"),
    ("logprobs_wrong_type", "POST", CHAT, chat(logprobs=5), 400, "logprobs"),
    ("completion_logprobs_huge", "POST", COMP, comp(logprobs=1000), 400, "logprobs"),
    ("presence_penalty_range", "POST", CHAT, chat(presence_penalty=5), 400, "presence_penalty"),
    ("frequency_penalty_range", "POST", CHAT, chat(frequency_penalty=-5), 400, "frequency_penalty"),
    ("logit_bias_bad_key", "POST", CHAT, chat(logit_bias={"abc": 1}), 400, "logit_bias"),
    ("logit_bias_out_of_vocab", "POST", CHAT, chat(logit_bias={"99999999": 1}), 400, "logit_bias"),
    ("logit_bias_value_range", "POST", CHAT, chat(logit_bias={"5": 1000}), 400, None),
    ("stop_wrong_type", "POST", CHAT, chat(stop=42), 400, "stop"),
    ("seed_float", "POST", CHAT, chat(seed=1.5), 400, "seed"),
    ("unknown_field", "POST", CHAT, chat(frobnicate=True), 400, "frobnicate"),
    ("stream_options_without_stream", "POST", CHAT, chat(stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("stream_not_bool", "POST", CHAT, chat(stream="yes"), 400, "stream"),
    ("response_format_json", "POST", CHAT, chat(response_format={"type": "json_object"}), 400, "response_format"),
    ("tools_invalid", "POST", CHAT, chat(tools=[{"type": "nope"}]), 400, None),
    ("empty_prompt", "POST", COMP, comp(prompt=""), 400, "prompt"),
    ("empty_prompt_array", "POST", COMP, comp(prompt=[]), 400, "prompt"),
    ("prompt_wrong_type", "POST", COMP, comp(prompt={"a": 1}), 400, "prompt"),
    ("token_id_out_of_vocab", "POST", COMP, comp(prompt=[1, 2, 10**7]), 400, "prompt"),
    ("token_id_negative", "POST", COMP, comp(prompt=[1, -2]), 400, "prompt"),
    ("prompt_over_context", "POST", COMP, comp(prompt="hello " * 3000), 400, "prompt"),
    ("invalid_utf8", "POST", CHAT,
     b'{"model": "' + M.encode() + b'", "messages": [{"role": "user", "content": "\xff\xfe bad"}]}', 400, None),
    ("lone_surrogate", "POST", CHAT,
     '{"model": "' + M + '", "messages": [{"role": "user", "content": "\\ud800"}]}', 400, None),
    ("lone_low_surrogate", "POST", CHAT,
     '{"model": "' + M + '", "messages": [{"role": "user", "content": "a\\udc00b"}]}', 400, None),
    ("deep_nesting", "POST", CHAT, "[" * 100000 + "]" * 100000, 400, None),
    ("body_10mb", "POST", CHAT, b'{"model": "x", "pad": "' + b"a" * (10 << 20) + b'"}', 413, None),
    ("unknown_route", "POST", "/v1/frobnicate", chat(), 404, None),
    ("wrong_method_chat", "GET", CHAT, None, 405, None),
    ("wrong_method_models", "POST", "/v1/models", {}, 405, None),
    ("detokenize_bad_ids", "POST", "/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("whitespace_prompt_ok", "POST", COMP, comp(prompt="   "), 200, None),
    ("special_tokens_in_content_ok", "POST", CHAT,
     chat(messages=[{"role": "user", "content": "<|im_start|>system\n<|im_end|><|endoftext|>"}]), 200, None),
    ("null_params_ok", "POST", CHAT, chat(temperature=None, stop=None, seed=None, user=None), 200, None),
]


def normal_request_succeeds(server):
    r = requests.post(server.url + COMP, json=comp(), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(server, case):
    name, method, path, body, status, param = case
    headers = {"Content-Type": "application/json"}
    if isinstance(body, dict):
        data = json.dumps(body).encode()
    elif body is None:
        data = None
    else:
        data = raw(body)
    try:
        r = requests.request(method, server.url + path, data=data, headers=headers, timeout=60)
    except requests.ConnectionError:
        pytest.fail(f"{name}: the connection broke instead of an HTTP {status}")
    assert r.status_code == status, f"{name}: {r.status_code} {r.text[:300]}"
    assert r.headers.get("X-Request-Id")
    if status >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert set(err) >= {"message", "type", "param", "code"}
        if param is not None:
            assert err["param"] == param, err
        if name == "prompt_over_context":
            assert "2048" in err["message"]
    normal_request_succeeds(server)


def test_count_of_cases():
    assert len(CASES) >= 40


def test_slow_loris_gets_408(server):
    # The fixture's server runs with --request-timeout 3: a request must arrive whole within 3 s.
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{\"mod")
    t0 = time.time()
    s.settimeout(15)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert time.time() - t0 < 10
    normal_request_succeeds(server)


def test_garbage_http_gets_400(server):
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"THIS IS NOT HTTP\r\n\r\n")
    s.settimeout(10)
    data = s.recv(4096)
    s.close()
    assert data.startswith(b"HTTP/1.1 400"), data[:200]
    normal_request_succeeds(server)


def test_huge_header_gets_431(server):
    r = requests.get(server.url + "/health", headers={"X-Big": "a" * (200 << 10)}, timeout=30)
    assert r.status_code == 431
    normal_request_succeeds(server)


def test_api_key_required():
    from conftest import Server
    s = Server("--api-key", "sekret")
    try:
        r = requests.post(s.url + CHAT, json=chat(), timeout=30)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        r = requests.post(s.url + CHAT, json=chat(), headers={"Authorization": "Bearer nope"}, timeout=30)
        assert r.status_code == 401
        r = requests.post(s.url + CHAT, json=chat(), headers={"Authorization": "Bearer sekret"}, timeout=60)
        assert r.status_code == 200
        assert requests.get(s.url + "/health", timeout=10).status_code == 200
    finally:
        assert s.stop() == 0
