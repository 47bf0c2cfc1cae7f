"""/metrics of the real server: every metric of issue 5 item 5 under its osprey:* name, and the counters move."""
import socket

import requests

from conftest import MODEL_NAME as M

REQUIRED = {
    "osprey:num_requests_running": "gauge",
    "osprey:num_requests_waiting": "gauge",
    "osprey:num_preemptions_total": "counter",
    "osprey:kv_cache_usage_perc": "gauge",
    "osprey:prefix_cache_queries_total": "counter",
    "osprey:prefix_cache_hits_total": "counter",
    "osprey:prompt_tokens_total": "counter",
    "osprey:generation_tokens_total": "counter",
    "osprey:time_to_first_token_seconds": "histogram",
    "osprey:inter_token_latency_seconds": "histogram",
    "osprey:request_time_per_output_token_seconds": "histogram",
    "osprey:e2e_request_latency_seconds": "histogram",
    "osprey:request_queue_time_seconds": "histogram",
    "osprey:request_prompt_tokens": "histogram",
    "osprey:request_generation_tokens": "histogram",
    "osprey:request_success_total": "counter",
    "osprey:http_requests_total": "counter",
    "osprey:http_errors_total": "counter",
}


def scrape(server):
    r = requests.get(server.url + "/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    return r.text


def value(text, name, labels=""):
    """Sum of the samples `name{...labels...}`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        key, v = line.rsplit(" ", 1)
        n, _, l = key.partition("{")
        if n == name and labels in l:
            total += float(v)
    return total


def test_every_metric_is_exposed_and_counts(server):
    before = scrape(server)
    for name, kind in REQUIRED.items():
        assert f"# TYPE {name} {kind}\n" in before, name
    # One streamed completion: prompt, generation, latency histograms and the queue time all move.
    r = requests.post(server.url + "/v1/completions", timeout=60,
                      json={"model": M, "prompt": "The sky is", "max_tokens": 3, "temperature": 0,
                            "ignore_eos": True})
    assert r.status_code == 200, r.text
    prompt_tokens = r.json()["usage"]["prompt_tokens"]
    # A 413 the transport answers itself, and a 404 from the API.
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.1 413")
    assert requests.get(server.url + "/no/such/route", timeout=10).status_code == 404
    after = scrape(server)

    def delta(name, labels=""):
        return value(after, name, labels) - value(before, name, labels)

    assert delta("osprey:prompt_tokens_total") == prompt_tokens
    assert delta("osprey:generation_tokens_total") == 3
    assert delta("osprey:request_success_total", 'finished_reason="length"') == 1
    for h in ("time_to_first_token_seconds", "request_queue_time_seconds", "e2e_request_latency_seconds",
              "request_time_per_output_token_seconds", "request_prompt_tokens", "request_generation_tokens"):
        assert delta(f"osprey:{h}_count") == 1, h
    assert 1 <= delta("osprey:inter_token_latency_seconds_count") <= 2  # 3 tokens in 2 or 3 outputs
    assert delta("osprey:http_errors_total", 'code="413"') == 1
    assert delta("osprey:http_errors_total", 'code="404"') == 1
    assert delta("osprey:http_requests_total", 'code="200"') >= 2  # the completion and the first scrape
    # Queue time ends at the first output, TTFT at the first token: never later.
    assert delta("osprey:request_queue_time_seconds_sum") <= delta("osprey:time_to_first_token_seconds_sum") + 1e-6
