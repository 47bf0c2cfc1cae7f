"""Bounded load on loopback (issue 5, item 6): 500 concurrent streaming requests (asyncio + httpx),
each checked against the same prompt's non-streamed greedy answer; then 500
again with 100 of them disconnected mid-stream, after which /metrics must show the engine idle and the KV
pool back at its idle usage.

One dedicated server (--max-num-seqs 256, a KV pool that holds 256 short sequences). Prompts are short and
drawn from a small set, max_tokens is small: the module takes well under a minute on 2 CPU cores.
"""
import asyncio
import json
import os
import time

import httpx
import openai
import pytest

from conftest import MODEL_NAME as M, Server

N = 500
N_DISCONNECT = 100
MAX_TOKENS = 8
# Raw completions prompts of 1 to 3 tokens: on 2 CPU cores the server's cost is the tokens the engine
# computes (about 15 CPU-seconds per 500-stream round), and a chat template would add ~30 per request.
PROMPTS = ["Hello", "The sky", "Once upon", "1, 2,", "Yes", "I think"]


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far (Linux /proc): the server's share of the work, which
    unlike wall time does not depend on what else the machine runs."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parse_metrics(text):
    """{(name, labels-without-le): value} of a Prometheus text page, histogram buckets left out."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.rsplit(" ", 1)
        name, _, labels = key.partition("{")
        if "le=" in labels:
            continue
        out[(name, labels.rstrip("}"))] = float(value)
    return out


def metric(m, name, **labels):
    """Sum of `name` over the samples whose labels include `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for (n, l), v in m.items() if n == name and all(w in l for w in want))


async def get_metrics(http, url):
    r = await http.get(url + "/metrics")
    assert r.status_code == 200
    return parse_metrics(r.text)


async def wait_idle(http, url, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        m = await get_metrics(http, url)
        if (metric(m, "osprey:num_requests_running") == 0 and metric(m, "osprey:num_requests_waiting") == 0
                and metric(m, "osprey:server_inflight_requests") == 0):
            return m
        if time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.1)


async def stream_one(http, url, prompt, max_tokens, disconnect=False, **extra):
    """Streams one greedy completion (SSE parsed here: the openai client's per-chunk pydantic parsing
    would make the test client, not the server, the bottleneck on 2 cores). Returns (text, finish_reason,
    completion_tokens); with `disconnect`, closes the connection as soon as the first content token arrived
    and returns (text, None, None)."""
    body = {"model": M, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    text, finish, usage, done = "", None, None, False
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            assert not done, "data after [DONE]"
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            for c in chunk["choices"]:
                assert c["index"] == 0
                text += c["text"]
                if c.get("finish_reason") is not None:
                    assert finish is None, "two finish reasons"
                    finish = c["finish_reason"]
            if disconnect and text:
                # Leaving the block with the body unread closes the connection: a client gone mid-stream.
                return text, None, None
    assert done, "no data: [DONE]"
    return text, finish, usage


@pytest.fixture(scope="module")
def load_server():
    s = Server("--max-num-seqs", "256", "--kv-cache-mb", "640", "--max-model-len", "1024")
    yield s
    assert s.stop() == 0


def make_clients(url):
    limits = httpx.Limits(max_connections=N + 50, max_keepalive_connections=N + 50)
    http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0))
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, http_client=http)
    return http, client


async def references(client):
    """Each prompt's non-streamed greedy answer through the real openai client (alone, one after the other)."""
    refs = {}
    for p in PROMPTS:
        r = await client.completions.create(model=M, prompt=p, max_tokens=MAX_TOKENS, temperature=0)
        refs[p] = (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens)
        assert refs[p][0], p
    return refs


def test_500_concurrent_streams_all_complete_correctly(load_server):
    url = load_server.url

    async def main():
        http, client = make_clients(url)
        async with http:
            refs = await references(client)
            before = await wait_idle(http, url)
            t0, c0 = time.monotonic(), cpu_seconds(load_server.proc.pid)
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(N)]
            results = await asyncio.gather(*(stream_one(http, url, p, MAX_TOKENS) for p in prompts))
            elapsed, cpu = time.monotonic() - t0, cpu_seconds(load_server.proc.pid) - c0
            after = await wait_idle(http, url)
            return refs, prompts, results, before, after, elapsed, cpu

    refs, prompts, results, before, after, elapsed, cpu = asyncio.run(main())
    print(f"\n{N} concurrent streams in {elapsed:.1f} s (server CPU {cpu:.1f} s)")
    assert len(results) == N  # gather raises on any failed request: none lost
    wrong = [(p, r) for p, r in zip(prompts, results) if (r[0], r[1]) != refs[p][:2]]
    assert not wrong, f"{len(wrong)} of {N} differ from the non-streamed answer, e.g. {wrong[:3]} vs {refs}"
    for p, (text, finish, usage) in zip(prompts, results):
        assert usage == refs[p][2], (p, usage)
    finished = sum(metric(after, "osprey:request_success_total", finished_reason=r) for r in ("stop", "length"))
    finished -= sum(metric(before, "osprey:request_success_total", finished_reason=r) for r in ("stop", "length"))
    assert finished == N
    assert metric(after, "osprey:num_requests_running") == 0
    assert metric(after, "osprey:num_requests_waiting") == 0
    assert metric(after, "osprey:kv_cache_usage_perc") == metric(before, "osprey:kv_cache_usage_perc")
    # Every request was queued and timed.
    got = metric(after, "osprey:request_queue_time_seconds_count") - metric(before, "osprey:request_queue_time_seconds_count")
    assert got == N


def test_500_streams_100_disconnected_mid_stream_free_their_kv(load_server):
    url = load_server.url

    async def main():
        http, client = make_clients(url)
        async with http:
            refs = await references(client)
            idle = await wait_idle(http, url)
            t0, c0 = time.monotonic(), cpu_seconds(load_server.proc.pid)
            jobs, kinds = [], []
            for i in range(N):
                p = PROMPTS[i % len(PROMPTS)]
                if i % (N // N_DISCONNECT) == 0:
                    # Long enough that it cannot finish on its own before the disconnect is noticed.
                    jobs.append(stream_one(http, url, p, 1000, disconnect=True, ignore_eos=True))
                    kinds.append(None)
                else:
                    jobs.append(stream_one(http, url, p, MAX_TOKENS))
                    kinds.append(p)
            results = await asyncio.gather(*jobs)
            after = await wait_idle(http, url)
            elapsed, cpu = time.monotonic() - t0, cpu_seconds(load_server.proc.pid) - c0
            return refs, kinds, results, idle, after, elapsed, cpu

    refs, kinds, results, idle, after, elapsed, cpu = asyncio.run(main())
    print(f"\n{N} streams, {N_DISCONNECT} disconnected, idle again after {elapsed:.1f} s (server CPU {cpu:.1f} s)")
    assert kinds.count(None) == N_DISCONNECT
    for p, (text, finish, usage) in zip(kinds, results):
        if p is None:
            assert text and finish is None  # disconnected after its first token
        else:
            assert (text, finish) == refs[p][:2], (p, text, finish, refs[p])
    assert metric(after, "osprey:num_requests_running") == 0, after
    assert metric(after, "osprey:num_requests_waiting") == 0, after
    assert metric(after, "osprey:server_inflight_requests") == 0, after
    # The KV pages of the cancelled sequences went back to the pool.
    assert metric(after, "osprey:kv_cache_usage_perc") == metric(idle, "osprey:kv_cache_usage_perc"), after
    assert metric(after, "osprey:num_free_kv_blocks") == metric(idle, "osprey:num_free_kv_blocks"), after
    # Each disconnected request was aborted (none could have run to its 1000-token limit).
    aborted = (metric(after, "osprey:request_success_total", finished_reason="abort")
               - metric(idle, "osprey:request_success_total", finished_reason="abort"))
    assert aborted == N_DISCONNECT
    ok = sum(metric(after, "osprey:request_success_total", finished_reason=r) for r in ("stop", "length"))
    ok -= sum(metric(idle, "osprey:request_success_total", finished_reason=r) for r in ("stop", "length"))
    assert ok == N - N_DISCONNECT
