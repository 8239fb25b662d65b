"""The decode example: tiny V4, V4.1 and GQA models served through HiCache give tokens
and logits bit-identical to a full recompute, with prefixes restored from host."""
import gc
import json

import pytest

import hicache_jax as hc
from conftest import CONFIGS
from examples import decode

SMALL = ["--requests", "8", "--turns", "2", "--gen-tokens", "6", "--preempt-every", "3", "--quiet"]


@pytest.mark.slow
@pytest.mark.parametrize("config,policy", [("tiny_v4", "write_through"), ("tiny_v4", "write_back"),
                                           ("tiny_v41", "write_back"), ("tiny_gqa", "write_through")])
def test_decode_is_bit_identical_with_host_hits(config, policy, capsys, tmp_path):
    """Every model and every write policy (the policy's own paths are the cache tests')."""
    metrics = tmp_path / "metrics.prom"
    code = decode.main(["--config", str(CONFIGS / f"{config}.json"), "--write-policy", policy,
                        "--metrics-out", str(metrics), *SMALL])
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["identical"] is True and code == 0 and result["compiles_while_serving"] == 0
    assert result["host_hit_tokens"] > 0 and result["load_bytes"] > 0 and result["backup_bytes"] > 0
    # the heap was frozen after warm-up and thawed after serving; each request says its GC share of TTFT
    assert result["gc_frozen_objects"] > 0 and gc.get_freeze_count() == 0
    for run in ("cache", "recompute"):
        assert len(result[f"gc_ms_in_ttft_{run}"]) == len(result[f"ttft_ms_{run}"]) == 8
        assert all(0 <= g <= t for g, t in zip(result[f"gc_ms_in_ttft_{run}"], result[f"ttft_ms_{run}"]))
    # warm-up ran every transfer program once: none runs for the first time while serving
    assert result["first_program_runs_in_ttft"] == [0] * 8 and result["first_program_runs_while_serving"] == 0
    assert set(result["transfer_waits"]) <= {"room", "pending_write"}   # waits for transfers in flight, counted
    # the cache's calls before each request's first forward are part of its TTFT
    assert all(0 < c < t for c, t in zip(result["cache_calls_ms_in_ttft"], result["ttft_ms_cache"], strict=True))
    assert result["recomputed_tokens"] < result["no_cache_computed_tokens"]
    # the default window policy: SWA pages at request ends and every N pages only
    assert result["window_policy"] == hc.DEFAULT_WINDOW_POLICY
    assert result["hit_tokens"] == result["host_hit_tokens"] + result["device_hit_tokens"]
    assert 0 < result["hit_rate"] < 1 and result["host_bytes_per_cached_token"] > 0
    if config != "tiny_gqa":
        assert 0 < result["backup_window_tokens"] <= result["backup_tokens"]
    text = metrics.read_text()
    assert "hicache_load_back_bytes_total" in text and "hicache_hit_tokens_total" in text


@pytest.mark.slow
@pytest.mark.parametrize("config, groups", [("tiny_v4", 1), ("tiny_v4", 2), ("tiny_v4", 4), ("tiny_v41", 2),
                                            ("tiny_v41", 4), ("tiny_gqa", 2), ("tiny_gqa", 4)])
def test_decode_with_overlapped_load_backs_is_bit_identical(config, groups, capsys):
    """--overlap: host hits are deferred loads that the first prefill chunk lands, layer
    group by layer group, inside its jit; tokens and logits stay bit-identical, and after
    warm-up nothing compiles, whatever size of block a hit brings."""
    code = decode.main(["--config", str(CONFIGS / f"{config}.json"), "--overlap", "--layer-groups", str(groups),
                        *SMALL])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["identical"] is True and code == 0 and result["overlap"] is True
    assert result["host_hit_tokens"] > 0 and result["deferred_loads"].get("step", 0) > 0
    assert result["compiles_while_serving"] == 0 and result["first_program_runs_while_serving"] == 0


@pytest.mark.slow
def test_more_requests_never_add_compilations(capsys):
    """Twice the requests (more hits, of more block sizes, more preemptions): still nothing
    compiled after warm-up, with or without overlap."""
    for extra in ([], ["--overlap"]):
        code = decode.main(["--config", str(CONFIGS / "tiny_v4.json"), "--requests", "24", "--turns", "4",
                            "--gen-tokens", "6", "--preempt-every", "3", "--quiet", *extra])
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert code == 0 and result["identical"] is True and result["host_hit_tokens"] > 0
        assert result["compiles_while_serving"] == 0


@pytest.mark.parametrize("argv,flag", [
    (["--config", "no/such/config.json"], "--config no/such/config.json: No such file"),
    (["--config", "README.md"], "not valid JSON"),
    (["--metrics-out", "/no/such/dir/metrics.prom"], "--metrics-out /no/such/dir/metrics.prom: cannot write"),
    (["--system-tokens", "3000"], "needs 16 pages of context but --max-pages is 8: raise --max-pages"),
    (["--max-pages", "16", "--system-tokens", "3000"], "but --device-pages is 8: raise --device-pages"),
    (["--preempt-every", "-1"], "--preempt-every must be >= 0, got -1"),
    (["--requests", "0"], "--requests must be in 1..10000, got 0"),
    (["--window-policy", "ends+every_0"], "--window-policy ends+every_0: window policy 'ends+every_0': expected"),
])
def test_bad_flags_are_one_line_before_any_work(argv, flag, capsys, monkeypatch):
    monkeypatch.setattr(decode, "make_cache", lambda *a, **k: pytest.fail("work started before the flags were checked"))
    with pytest.raises(SystemExit) as exc:
        decode.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and flag in err[0]


def test_every_flag_has_help_with_its_default(capsys):
    with pytest.raises(SystemExit):
        decode.main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--seed", "--requests", "--device-pages", "--host-pages", "--write-policy", "--max-pages",
                 "--preempt-every", "--metrics-out", "--window-policy"):
        assert flag in out
    assert out.count("(default:") >= 15
