"""markbase-bench (bench/markbase_bench.cpp): the decode floor from a given bandwidth, and clear
errors for arguments it cannot honour (exit code 2 for bad arguments, 1 for a failed run)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig

import pytest


def _bench() -> str:
    for d in (sysconfig.get_path("scripts"), os.path.dirname(shutil.which("python3") or "")):
        p = os.path.join(d, "markbase-bench")
        if os.path.exists(p):
            return p
    pytest.skip("markbase-bench is not installed beside this Python")


def _run(*args):
    return subprocess.run([_bench(), *args], capture_output=True, text=True, timeout=300)


def test_floor_from_given_bandwidth(tiny_models):
    r = _run("--model", tiny_models["gemma3"].path, "--backend", "cpu", "--prompt-tokens", "8",
             "--gen-tokens", "3", "--repeats", "1", "--json", "--read-bandwidth-gbs", "12.5")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["read_bandwidth_gbs"] == pytest.approx(12.5)
    assert row["decode_floor_tok_s"] == pytest.approx(12.5e9 / row["decode_weight_bytes"], rel=1e-3)
    assert row["prefill_chunk"] == 0  # the backend's choice


def test_prefill_chunk_option(tiny_models):
    r = _run("--model", tiny_models["gemma3"].path, "--backend", "cpu", "--prompt-tokens", "9",
             "--gen-tokens", "2", "--repeats", "1", "--prefill-chunk", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["prefill_chunk"] == 4


def test_sampled_decode(tiny_models):
    """--temperature and the cuts: decode samples (seeded) instead of taking the arg-max, and the
    JSON row says with what; without them it is greedy."""
    base = ["--model", tiny_models["gemma3"].path, "--backend", "cpu", "--prompt-tokens", "8", "--gen-tokens", "6",
            "--repeats", "1", "--json"]
    r = _run(*base, "--temperature", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05",
             "--repeat-penalty", "1.1")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert (row["temperature"], row["top_k"], row["top_p"], row["min_p"], row["repeat_penalty"]) == \
        (pytest.approx(0.8), 40, pytest.approx(0.95), pytest.approx(0.05), pytest.approx(1.1))
    assert row["decode_tok_s"] > 0
    r = _run(*base)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert (row["temperature"], row["top_k"], row["top_p"], row["min_p"], row["repeat_penalty"]) == (0, 0, 1, 0, 1)


@pytest.mark.parametrize("args,message", [
    (["--temperature", "warm"], "bad value for --temperature"),
    (["--temperature", "-1"], "temperature must be"),
    (["--top-k", "-1"], "bad value for --top-k"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--min-p", "2"], "min_p must be in [0, 1]"),
    (["--repeat-penalty", "0"], "repeat_penalty must be"),
    (["--bandwidth", "--read-bandwidth-gbs", "10"], "exclude each other"),
    (["--read-bandwidth-gbs", "abc"], "bad value for --read-bandwidth-gbs"),
    (["--read-bandwidth-gbs", "-3"], "bad value for --read-bandwidth-gbs"),
    (["--prompt-tokens", "0"], "bad value for --prompt-tokens"),
    (["--prefill-chunk", "0"], "bad value for --prefill-chunk"),
    (["--backend", "tpu"], "--backend must be"),
])
def test_bad_arguments(tiny_models, args, message):
    r = _run("--model", tiny_models["gemma3"].path, *args)
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)


def test_host_bandwidth_refused_for_gpu_backends(tiny_models):
    """--bandwidth measures the host's RAM: with a GPU backend it is an error, raised before the run
    (or the backend itself is unavailable here: also a clear error, exit code 1)."""
    for backend in ("metal", "cuda"):
        r = _run("--model", tiny_models["gemma3"].path, "--backend", backend, "--bandwidth")
        assert r.returncode == 1, (backend, r.returncode, r.stderr)
        assert "--read-bandwidth-gbs" in r.stderr or "not available" in r.stderr, r.stderr
