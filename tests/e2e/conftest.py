"""Fixtures of the osprey serve end-to-end tests.

Each server fixture starts the real `osprey serve --model default` on a free
loopback port, waits for /ready, and stops it with SIGTERM afterwards. The
binary is $OSPREY_BIN, else <repo>/$OSPREY_BUILD_DIR/tools/osprey (default
build/). Requirements: tests/e2e/requirements.txt (see run.sh).
"""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"  # the default model's served name


def osprey_bin() -> str:
    if os.environ.get("OSPREY_BIN"):
        return os.environ["OSPREY_BIN"]
    return str(REPO / os.environ.get("OSPREY_BUILD_DIR", "build") / "tools" / "osprey")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra_args, ready_timeout=180.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("E2E_LOG_DIR", "/tmp")) / f"osprey-serve-{self.port}.log"
        self.log = open(self.log_path, "wb")
        options = {"--max-model-len": "2048", "--kv-cache-mb": "256", "--request-timeout": "3",
                   "--shutdown-timeout": "10"}
        extra = list(extra_args)
        for i in range(0, len(extra) - 1):
            if extra[i] in options:
                options[extra[i]] = extra[i + 1]
                extra[i] = extra[i + 1] = None
        args = [osprey_bin(), "serve", "--model", "default", "--host", "127.0.0.1", "--port", str(self.port)]
        for k, v in options.items():
            args += [k, v]
        args += [a for a in extra if a is not None]
        if os.environ.get("E2E_THREADS"):
            args += ["--threads", os.environ["E2E_THREADS"]]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"osprey serve exited with {self.proc.returncode}: {self.read_log()}")
            try:
                if requests.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("osprey serve did not become ready: " + self.read_log())

    def read_log(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, timeout=30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def metrics(self) -> dict:
        """Unlabelled-by-le samples of /metrics as {name: value} (labels dropped)."""
        text = requests.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if "le=" in name_labels:
                continue
            out[name] = out.get(name, 0.0) + float(value)
        return out


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="session")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model():
    return MODEL_NAME
