"""The benchmarks keep working: each runs in its --smoke mode and writes its JSON."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT


def run(script, tmp_path, *args):
    out = tmp_path / "result.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--smoke", "--out", str(out), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(out.read_text())


def test_bench_tree_smoke(tmp_path):
    result = run("bench_tree.py", tmp_path)
    for r in result["runs"]:
        assert r["nodes"] > 100 and r["match_us"]["p50"] > 0 and r["insert_us"]["p50"] > 0


@pytest.mark.slow
def test_bench_decode_smoke(tmp_path):
    result = run("bench_decode.py", tmp_path, "--configs", "tiny_v4")
    assert all(r["identical"] for r in result["runs"])
    assert result["runs"][0]["host_hit_tokens"] > 0


def test_bench_gemma_chunk_smoke(tmp_path):
    result = run("bench_gemma_chunk.py", tmp_path, "--chunks", "16,64")
    assert [r["chunk"] for r in result["runs"]] == [16, 64]
    assert all(r["call_ms"] > 0 and r["no_head_ms"] > 0 for r in result["runs"])
