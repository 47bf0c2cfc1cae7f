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


def _queue_and_ttft(server):
    text = scrape(server)
    return (value(text, "osprey:request_queue_time_seconds_sum"), value(text, "osprey:request_queue_time_seconds_count"),
            value(text, "osprey:time_to_first_token_seconds_sum"))


def test_queue_time_is_the_engines_not_the_first_output():
    """osprey:request_queue_time_seconds comes from the engine (submit -> first scheduled): it excludes the
    prefill, and it includes the wait behind a full batch."""
    import threading
    import time

    from conftest import Server
    s = Server("--max-num-seqs", "1")
    try:
        # 1. Alone on an idle server, a ~1500-token prompt: the queue time is the engine picking it up at
        #    once, while TTFT contains the whole prefill (1500 tokens take well over 100 ms on any CPU).
        q0, n0, t0 = _queue_and_ttft(s)
        prompt = "The quick brown fox jumps over the lazy dog. " * 150
        r = requests.post(s.url + "/v1/completions", timeout=120,
                          json={"model": M, "prompt": prompt, "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > 1000
        q1, n1, t1 = _queue_and_ttft(s)
        assert n1 - n0 == 1
        assert (q1 - q0) < 0.5 * (t1 - t0), (q1 - q0, t1 - t0)

        # 2. One sequence at a time: B, sent while A streams 200 tokens, waits for all of A.
        a_done = {}

        def run_a(started):
            with requests.post(s.url + "/v1/completions", stream=True, timeout=120,
                               json={"model": M, "prompt": "Once upon a time", "max_tokens": 200,
                                     "temperature": 0, "ignore_eos": True, "stream": True}) as ra:
                for line in ra.iter_lines():
                    if line:
                        started.set()
            a_done["t"] = time.monotonic()

        started = threading.Event()
        ta = threading.Thread(target=run_a, args=(started,))
        ta.start()
        assert started.wait(60)
        t_b = time.monotonic()
        rb = requests.post(s.url + "/v1/completions", timeout=120,
                           json={"model": M, "prompt": "Hello", "max_tokens": 2, "temperature": 0})
        ta.join()
        assert rb.status_code == 200, rb.text
        q2, n2, _ = _queue_and_ttft(s)
        assert n2 - n1 == 2
        # B's queue time alone covers A's remaining decode (B was scheduled only after A finished);
        # half of it as seen by this client, to leave room for delivery of A's last chunk.
        waited = a_done["t"] - t_b
        assert waited > 0.1
        assert (q2 - q1) >= 0.5 * waited, (q2 - q1, waited)
    finally:
        assert s.stop() == 0
