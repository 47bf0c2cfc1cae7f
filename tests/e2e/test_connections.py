"""Thousands of idle keep-alive connections (issue 5, item 1): the server holds ~2000 of them without a
thread each, still answers a normal request promptly, keeps the idle ones usable, and lets them go."""
import asyncio
import resource
import time

import requests

from conftest import MODEL_NAME as M

N_IDLE = 2000


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == resource.RLIM_INFINITY or soft >= need, f"RLIMIT_NOFILE {soft} < {need}: raise `ulimit -Hn`"


async def get_health(reader, writer):
    """One GET /health on an open keep-alive connection; returns the status line."""
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = 0
    for h in lines[1:]:
        k, _, v = h.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v)
        assert not (k.strip().lower() == "connection" and v.strip().lower() == "close"), head
    await reader.readexactly(length)
    return lines[0]


def open_connections(server):
    return requests.get(server.url + "/metrics", timeout=10).text


def gauge(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_thousands_of_idle_keepalive_connections(server):
    raise_fd_limit(N_IDLE + 256)
    base = gauge(open_connections(server), "osprey:http_connections_open")

    async def main():
        async def open_one():
            async def go():
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                assert await get_health(reader, writer) == "HTTP/1.1 200 OK"
                return reader, writer
            return await asyncio.wait_for(go(), 30)

        conns = []
        t0 = time.monotonic()
        for _ in range(0, N_IDLE, 250):  # in waves, well inside the listen backlog
            conns += await asyncio.gather(*(open_one() for _ in range(250)))
        opened = time.monotonic() - t0
        loop = asyncio.get_running_loop()
        try:
            # Everything is idle now; the server holds every connection.
            text = await loop.run_in_executor(None, open_connections, server)
            assert gauge(text, "osprey:http_connections_open") >= base + N_IDLE

            # A normal request on a fresh connection still succeeds promptly.
            def normal():
                t = time.monotonic()
                r = requests.post(server.url + "/v1/chat/completions", timeout=60,
                                  json={"model": M, "messages": [{"role": "user", "content": "Say hi."}],
                                        "max_tokens": 4, "temperature": 0})
                return r, time.monotonic() - t

            r, took = await loop.run_in_executor(None, normal)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"]
            assert took < 20, f"a request next to {N_IDLE} idle connections took {took:.1f} s"

            # The idle connections are still open and usable (a sample of them, after the request).
            statuses = await asyncio.gather(*(get_health(rd, wr) for rd, wr in conns[::50]))
            assert all(s == "HTTP/1.1 200 OK" for s in statuses)
        finally:
            for _, wr in conns:
                wr.close()
            await asyncio.gather(*(wr.wait_closed() for _, wr in conns), return_exceptions=True)
        return opened, took

    opened, took = asyncio.run(main())
    print(f"\n{N_IDLE} keep-alive connections opened in {opened:.1f} s; a request next to them took {took:.2f} s")
    # The server lets them go.
    deadline = time.time() + 20
    while gauge(open_connections(server), "osprey:http_connections_open") > base + 5 and time.time() < deadline:
        time.sleep(0.1)
    assert gauge(open_connections(server), "osprey:http_connections_open") <= base + 5
