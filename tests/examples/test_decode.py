"""The decode example: tiny V4, V4.1 and GQA models served through HiCache give tokens
and logits bit-identical to a full recompute, with prefixes restored from host."""
import json

import pytest

from conftest import CONFIGS
from examples import decode

SMALL = ["--requests", "8", "--turns", "2", "--gen-tokens", "6", "--preempt-every", "3", "--quiet"]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny_v4", "tiny_v41", "tiny_gqa"])
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_decode_is_bit_identical_with_host_hits(config, policy, capsys, tmp_path):
    metrics = tmp_path / "metrics.prom"
    code = decode.main(["--config", str(CONFIGS / f"{config}.json"), "--write-policy", policy,
                        "--metrics-out", str(metrics), *SMALL])
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["identical"] is True and code == 0
    assert result["host_hit_tokens"] > 0 and result["load_bytes"] > 0 and result["backup_bytes"] > 0
    assert result["recomputed_tokens"] < result["no_cache_computed_tokens"]
    text = metrics.read_text()
    assert "hicache_load_back_bytes_total" in text and "hicache_hit_tokens_total" in text
