"""Warm starts across processes. The decode example over a storage tier: a second process
with the same `--storage` serves the first one's prefixes from L3, bit-identical
(tensorstore on a directory and Mooncake Store on loopback); the store
is the only thing the two processes share. And a snapshot written by one process warms
the host tier of a new one."""
import json
import pathlib
import subprocess
import sys

import pytest

from conftest import CONFIGS, ROOT

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[1] / d) for d in ("storage", "cache")]
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
@pytest.mark.parametrize("config", ["tiny_v41", "tiny_gqa"])   # tiny_v41 has every pool kind tiny_v4 has
def test_a_second_process_serves_from_a_tensorstore_directory(config, tmp_path):
    check_second_run_hits(config, f"file://{tmp_path / 'store'}")


@pytest.mark.slow
@needs_mooncake
def test_a_second_process_serves_from_mooncake(tmp_path):
    """The backend, on the model with the most pools (the models are covered above)."""
    server = start_mooncake(tmp_path)
    try:
        check_second_run_hits("tiny_v41", server.url)
    finally:
        server.stop()


RESTORE = """
import sys
sys.path[:0] = [{tests!r}, {cache!r}]
import hicache_jax as hc
from driver import Driver, layout
c = hc.HiCache(layout({name!r}), hc.HiCacheConfig(device_pages=6, host_pages=12, check_invariants=True))
assert c.restore_snapshot({path!r}) == 4
d = Driver(c)
served = [d.request(blocks) for blocks in ([0, 1, 2], [0, 1, 3], [4])]
assert served == [768, 768, 256], served
print("restored and served", d.host_hits, "host tokens")
"""


@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny_v4", "tiny_gqa"])
def test_a_snapshot_warms_a_new_process(config, tmp_path):
    import hicache_jax as hc
    from driver import Driver, layout
    c = hc.HiCache(layout(config), hc.HiCacheConfig(device_pages=6, host_pages=12))
    d = Driver(c)
    for blocks in ([0, 1, 2], [0, 1, 3], [4]):
        d.request(blocks)
    assert c.save_snapshot(tmp_path / "snap") == 4
    code = RESTORE.format(tests=str(ROOT / "tests"), cache=str(ROOT / "tests" / "cache"), name=config,
                          path=str(tmp_path / "snap"))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "restored and served" in r.stdout
