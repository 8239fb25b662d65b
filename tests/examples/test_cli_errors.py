"""What a user typing a wrong flag sees: the examples run as commands (a subprocess each,
from an empty directory), one class of input per test. A bad input ends the run before
any long work with exit status 2 and exactly one line on stderr naming the flag and its
value, and nothing is written. An unreachable store is not an error: one warning line,
then the run serves from device and host."""
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from conftest import CONFIGS, ROOT

DECODE, CHAT = ROOT / "examples" / "decode.py", ROOT / "examples" / "chat.py"


def run(script, *argv, cwd, timeout=120):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(script), *map(str, argv)], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return p, time.monotonic() - t0


def refused(script, *argv, names, cwd):
    """Run; assert a one-line refusal naming every string of `names`, and nothing written."""
    before = sorted(cwd.rglob("*"))
    p, seconds = run(script, *argv, cwd=cwd)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(f"{script.name}: error: "), p.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert p.stdout == "" and sorted(cwd.rglob("*")) == before
    return lines[0]


@pytest.mark.parametrize("script,argv,names", [
    (DECODE, ["--seed", "-1"], ["--seed", "-1"]),
    (DECODE, ["--seed", "x"], ["--seed", "'x'"]),
    (DECODE, ["--overlap", "--layer-groups", "0"], ["--layer-groups", "got 0"]),
    (DECODE, ["--overlap", "--layer-groups", "1000"], ["--layer-groups", "1..5", "got 1000"]),
    (DECODE, ["--requests", "0"], ["--requests", "got 0"]),
    (DECODE, ["--max-pages", "100000000"], ["--max-pages", "1..4096", "got 100000000"]),
    (DECODE, ["--system-tokens", "100000000000"], ["--system-tokens", "got 100000000000"]),
    (DECODE, ["--system-tokens", "3000"], ["needs 16 pages of context but --max-pages is 8"]),
    (DECODE, ["--storage-retry-s", "-1"], ["--storage-retry-s", "-1"]),
    (CHAT, ["--device-pages", "0"], ["--device-pages must be >= 1, got 0"]),
    (CHAT, ["--users", "9"], ["--users", "1..4", "got 9"]),
])
def test_bad_numbers(script, argv, names, tmp_path):
    refused(script, *argv, names=names, cwd=tmp_path)


def gguf_header(architecture: str) -> bytes:
    """The first bytes of a GGUF file: magic, version 3, 0 tensors, 1 entry (a string)."""
    key = b"general.architecture"
    value = architecture.encode()
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<IQ", 8, len(value)) + value)


def test_bad_files_and_configs(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    negative = tmp_path / "negative.json"
    negative.write_text(json.dumps({**json.loads((CONFIGS / "tiny_v4.json").read_text()), "hidden_size": -128}))
    malformed = tmp_path / "malformed.json"
    malformed.write_text("{")
    not_gguf, llama = tmp_path / "weights.bin", tmp_path / "llama.gguf"
    not_gguf.write_bytes(b"\0" * 64)
    llama.write_bytes(gguf_header("llama") + b"\0" * 64)
    for script in (DECODE, CHAT):
        refused(script, "--config", "no/such.json", names=["--config no/such.json", "No such file"], cwd=work)
        refused(script, "--config", malformed, names=[f"--config {malformed}", "not valid JSON"], cwd=work)
    refused(DECODE, "--config", negative, names=[f"--config {negative}", "'hidden_size'", "-128"], cwd=work)
    refused(CHAT, "--config", "configs/tiny_v4.json", names=["--config", "tiny_v4.json", "gemma3_text"], cwd=work)
    refused(CHAT, "--gguf", not_gguf, names=[f"--gguf {not_gguf}", "not a GGUF file"], cwd=work)
    refused(CHAT, "--gguf", llama, names=[f"--gguf {llama}", "'llama'"], cwd=work)
    refused(DECODE, "--storage", "ftp://x", names=["--storage ftp://x", "unknown storage URL scheme 'ftp'"], cwd=work)
    refused(DECODE, "--storage", "mooncake://h", names=["--storage mooncake://h", "host:port"], cwd=work)


def test_unwritable_outputs(tmp_path):
    for script in (DECODE, CHAT):
        refused(script, "--metrics-out", "/proc/nope/m.txt", names=["--metrics-out /proc/nope/m.txt"], cwd=tmp_path)
        refused(script, "--metrics-out", tmp_path, names=[f"--metrics-out {tmp_path}", "is a directory"], cwd=tmp_path)
        # a writable output named beside a bad flag is not created either
        refused(script, "--metrics-out", "m.txt", "--device-pages", "0", names=["--device-pages"], cwd=tmp_path)


def test_device_and_host_memory_too_small(tmp_path):
    line = refused(DECODE, "--device-pages", 10 ** 9, names=["--device-pages 1000000000", "GiB"], cwd=tmp_path)
    assert "device pools need" in line
    line = refused(DECODE, "--host-pages", 10 ** 9, names=["--host-pages 1000000000", "GiB"], cwd=tmp_path)
    assert "host tier needs" in line
    refused(CHAT, "--device-pages", 10 ** 9, names=["--device-pages 1000000000", "device pools need"], cwd=tmp_path)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_unreachable_storage_is_one_warning_then_serving(tmp_path):
    url = f"mooncake://127.0.0.1:{closed_port()}"
    small = ["--requests", "4", "--turns", "2", "--gen-tokens", "4", "--quiet"]
    p, seconds = run(DECODE, "--storage", url, *small, cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 0 and json.loads(p.stdout.splitlines()[-1])["identical"] is True
    assert len(lines) == 1 and "L3 storage degraded" in lines[0] and url in lines[0], p.stderr
    assert "cannot reach mooncake_master" in lines[0]
    # a retry budget (how long it keeps trying: tests/cache/test_storage_tier.py), then the same one line
    p, _ = run(DECODE, "--storage", url, "--storage-retry-s", "1", *small, cwd=tmp_path)
    assert p.returncode == 0 and len(p.stderr.strip().splitlines()) == 1
