"""`osprey bench serve` against the real `osprey serve --model default` (issue 6): every request
completes, output lengths are what was asked (ignore_eos + max_tokens), prompt lengths are exact
(the workload is built with the model's own tokenizer), token counts come from the server's usage,
and the CSV / SVG outputs of a small concurrency sweep are written.
"""
import csv
import json
import subprocess

from conftest import osprey_bin


def bench(server, tmp_path, *args, timeout=120):
    out = tmp_path / "bench.json"
    cmd = [osprey_bin(), "bench", "serve", "--base-url", server.url, "--model", "default", "--seed", "1",
           "--no-progress", "--output-json", str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(out.read_text()), p.stdout


def test_completions_fixed_lengths(server, tmp_path):
    j, stdout = bench(server, tmp_path, "--num-prompts", "10", "--input-len", "32", "--output-len", "16",
                      "--request-rate", "inf", "--max-concurrency", "5", "--slo", "ttft=60s,tpot=10s")
    assert len(j["runs"]) == 1
    r = j["runs"][0]
    assert r["completed"] == 10 and r["failed"] == 0, r["errors"]
    assert r["usage_reported"] == 10
    assert r["total_output_tokens"] == 10 * 16
    assert r["output_len_mismatch"] == 0
    assert r["total_input_tokens"] == 10 * 32
    assert r["good_requests"] == 10
    assert 0 < r["mean_ttft_ms"] <= r["max_ttft_ms"]
    assert r["median_itl_ms"] > 0 and r["p99_e2el_ms"] >= r["median_e2el_ms"]
    assert r["output_throughput"] > 0
    assert "Successful requests" in stdout


def test_chat_sweep_writes_csv_and_charts(server, tmp_path):
    csv_path = tmp_path / "runs.csv"
    plots = tmp_path / "plots"
    j, _ = bench(server, tmp_path, "--endpoint", "/v1/chat/completions", "--num-prompts", "4", "--input-len", "16",
                 "--output-len", "8", "--max-concurrency", "1,4", "--output-csv", str(csv_path),
                 "--plot-dir", str(plots))
    assert [r["max_concurrency"] for r in j["runs"]] == [1, 4]
    for r in j["runs"]:
        assert r["completed"] == 4 and r["failed"] == 0, r["errors"]
        assert r["total_output_tokens"] == 4 * 8
    rows = list(csv.DictReader(csv_path.open()))
    assert [row["max_concurrency"] for row in rows] == ["1", "4"]
    for name in ("ttft_cdf.svg", "itl_cdf.svg", "sweep_throughput.svg", "sweep_p99_latency.svg"):
        text = (plots / name).read_text()
        assert text.startswith("<svg") and "</svg>" in text
