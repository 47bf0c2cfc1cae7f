"""Disconnects, bounded load, the queue limit and SIGTERM drain."""
import concurrent.futures as cf
import json
import signal
import socket
import time

import requests

from conftest import MODEL_NAME as M, Server


def wait_until(pred, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def open_stream(port, body):
    """Sends a streaming request on a raw socket; returns it once the first token arrived (the second event:
    the first is the role chunk, sent before the engine schedules the request)."""
    s = socket.create_connection(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    s.settimeout(60)
    data = b""
    while data.count(b"data: ") < 2:
        chunk = s.recv(4096)
        assert chunk, data
        data += chunk
    return s, data


def idle(server):
    m = server.metrics()
    return (m["osprey:num_requests_running"] == 0 and m["osprey:num_requests_waiting"] == 0
            and m["osprey:server_inflight_requests"] == 0)


def test_disconnect_mid_stream_frees_kv_pages(server):
    assert wait_until(lambda: idle(server))
    base = server.metrics()
    free_idle = base["osprey:num_free_kv_blocks"]
    socks = []
    try:
        for i in range(8):
            s, _ = open_stream(server.port, {"model": M, "messages": [{"role": "user", "content": f"Tell a story {i}"}],
                                             "max_tokens": 1000, "stream": True, "ignore_eos": True})
            socks.append(s)
        assert server.metrics()["osprey:server_inflight_requests"] == 8
        # Pages are taken once the engine schedules them.
        assert wait_until(lambda: server.metrics()["osprey:num_free_kv_blocks"] < free_idle)
        assert server.metrics()["osprey:kv_cache_usage_perc"] > 0
    finally:
        for s in socks:
            s.close()
    assert wait_until(lambda: idle(server), 30), server.metrics()
    after = server.metrics()
    assert after["osprey:num_free_kv_blocks"] == free_idle
    assert after["osprey:request_success_total"] >= 8


def test_bounded_concurrent_load(server):
    n = 64
    prompt = "Say hello."

    def one(i):
        body = {"model": M, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "temperature": 0,
                "stream": i % 2 == 0}
        r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300, stream=body["stream"])
        assert r.status_code == 200, r.text
        if body["stream"]:
            text, done = "", False
            for line in r.iter_lines():
                if not line:
                    continue
                assert line.startswith(b"data: ")
                if line == b"data: [DONE]":
                    done = True
                    continue
                ch = json.loads(line[6:])
                if ch["choices"]:
                    text += ch["choices"][0]["delta"].get("content") or ""
            assert done
            return text
        return r.json()["choices"][0]["message"]["content"]

    ref = one(1)
    with cf.ThreadPoolExecutor(n) as ex:
        outs = list(ex.map(one, range(n)))
    assert len(outs) == n
    # Greedy: every request sees the same answer, batched or not.
    assert all(o == ref for o in outs), set(outs)
    assert wait_until(lambda: idle(server))


def test_queue_limit_gives_429():
    s = Server("--max-queue", "1", "--max-num-seqs", "1")
    try:
        long_body = {"model": M, "messages": [{"role": "user", "content": "Count to a thousand."}],
                     "max_tokens": 400, "stream": True, "ignore_eos": True}
        a, _ = open_stream(s.port, long_body)  # running: the only sequence slot
        b, _ = None, None
        with cf.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(requests.post, s.url + "/v1/chat/completions",
                            json={**long_body, "stream": False, "max_tokens": 2}, timeout=120)
            assert wait_until(lambda: s.metrics()["osprey:server_queued_requests"] == 1, 30)
            r = requests.post(s.url + "/v1/chat/completions", json={**long_body, "stream": False, "max_tokens": 2},
                              timeout=30)
            assert r.status_code == 429, r.text
            assert r.headers["Retry-After"] == "1"
            assert r.json()["error"]["code"] == "queue_full"
            a.close()  # frees the slot: the queued one completes
            assert fut.result().status_code == 200
    finally:
        assert s.stop() == 0


def test_sigterm_drains_then_aborts():
    s = Server("--shutdown-timeout", "2")
    try:
        short = {"model": M, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}
        long_body = {"model": M, "messages": [{"role": "user", "content": "Tell a long story."}],
                     "max_tokens": 1800, "stream": True, "ignore_eos": True}
        a, head_a = open_stream(s.port, short)
        b, head_b = open_stream(s.port, long_body)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # No new connections once draining.
        refused = False
        try:
            requests.get(s.url + "/health", timeout=2)
        except requests.ConnectionError:
            refused = True
        assert refused

        def rest(sock, head):
            data = head
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data

        body_a = rest(a, head_a)
        body_b = rest(b, head_b)
        assert b"data: [DONE]" in body_a
        assert b'"finish_reason":"length"' in body_a or b'"finish_reason":"stop"' in body_a
        # The long one could not finish in 2 s: aborted, with its finish_reason set and the stream closed properly.
        assert b'"finish_reason":"abort"' in body_b
        assert body_b.rstrip().endswith(b"0") or b"data: [DONE]" in body_b
        assert s.proc.wait(timeout=30) == 0
    finally:
        s.stop()
