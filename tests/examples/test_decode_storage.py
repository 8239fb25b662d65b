"""The decode example over a storage tier: a second process with the same `--storage`
serves the first one's prefixes from L3, bit-identical (tensorstore on a directory for
every tiny model, and Mooncake Store on loopback); the store is the only thing the two
processes share."""
import json
import subprocess
import sys
import pathlib

import pytest

from conftest import CONFIGS, ROOT

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "storage"))
from storage_helpers import needs_mooncake, start_mooncake  # noqa: E402

ARGS = ["--requests", "6", "--turns", "2", "--gen-tokens", "4", "--preempt-every", "0", "--quiet"]


def run(config: str, storage: str) -> dict:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "decode.py"), "--config", str(CONFIGS / f"{config}.json"),
                        "--storage", storage, *ARGS], cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={"MC_LOG_LEVEL": "WARNING", **__import__("os").environ})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_second_run_hits(config: str, storage: str) -> None:
    first = run(config, storage)
    second = run(config, storage)
    assert first["identical"] and second["identical"]
    assert first["storage_hit_tokens"] == 0 and second["storage_hit_tokens"] > 0
    assert second["recomputed_tokens"] < first["recomputed_tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny_v4", "tiny_v41", "tiny_gqa"])
def test_a_second_process_serves_from_a_tensorstore_directory(config, tmp_path):
    check_second_run_hits(config, f"file://{tmp_path / 'store'}")


@pytest.mark.slow
@needs_mooncake
def test_a_second_process_serves_from_mooncake(tmp_path):
    server = start_mooncake(tmp_path)
    try:
        check_second_run_hits("tiny_v4", server.url)
    finally:
        server.stop()
