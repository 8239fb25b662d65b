"""serve_trace.py: a trace through the batched loop with HiCache, device-only and no cache.

The conversation trace's CPU acceptance run, and a trace the loop has not seen, written
here in Mooncake's format with another hash structure (a system prompt every
conversation shares, turns that extend the previous turn): both batch several
sequences, find prefixes on the host, and give every request the bits it has alone.
Bad flags end the run before any work, with one line naming the value.
"""
import json
import pathlib

import numpy as np
import pytest

import hicache_jax as hc
from conftest import CONFIGS, ROOT
from examples import serve_trace
from examples.batching import loop, modes

TRACE = ROOT / "traces" / "conversation_trace.jsonl.gz"
PNG = b"\x89PNG\r\n\x1a\n"


def conversation_trace(path: pathlib.Path, conversations: int = 6, turns: int = 3, turn_gap_ms: int = 4000,
                       spread_ms: int = 150) -> pathlib.Path:
    """A Mooncake-format trace: every prompt opens with the same 2-block system prompt
    (hash ids 0, 1); turn t + 1 of a conversation is turn t's prompt, its answer and a new
    message, so it keeps every whole block of turn t and replaces the partial last one."""
    fresh = iter(range(100, 10**6))
    records = []
    for c in range(conversations):
        blocks, length = [0, 1, next(fresh), next(fresh)], 3 * 512 + 200 + 37 * c
        for t in range(turns):
            records.append({"timestamp": t * turn_gap_ms + c * spread_ms, "input_length": length,
                            "output_length": 60, "hash_ids": list(blocks)})
            length += 300 + 64 * t
            blocks = blocks[:-1] + [next(fresh) for _ in range(-(-length // 512) - len(blocks) + 1)]
    records.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run(capsys, *argv) -> tuple[int, dict]:
    code = serve_trace.main([*argv, "--quiet"])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def assert_served_well(result: dict, requests: int) -> None:
    assert result["requests"] == requests and result["identical"] is True
    assert result["identical_sample"] and result["identical_across_runs"] and len(result["check_sample"]) == 3
    assert result["max_batch"] >= 2
    assert result["hit_tokens"]["host"] > 0 and result["bytes_moved"]["host_to_device"] > 0
    assert result["compiles_while_serving"] == 0
    runs = result["runs"]
    assert runs["device_only"]["hit_tokens"]["host"] == 0 and runs["device_only"]["bytes_moved"] == \
        {"device_to_host": 0, "host_to_device": 0}
    assert runs["no_cache"]["hit_tokens"] == {"device": 0, "host": 0, "storage": 0}
    assert runs["no_cache"]["computed_tokens"] > runs["hicache"]["computed_tokens"]
    loads = runs["hicache"]["program_calls"]     # its host hits moved by the cache's programs, counted by kind
    assert sum(v for k, v in loads.items() if "load" in k or "unpack" in k) > 0
    assert runs["hicache"]["fused_loads"] == loads.get("plan:load_pieces", 0) <= sum(loads.values())
    assert runs["no_cache"]["program_calls"] == {} and runs["no_cache"]["fused_loads"] == 0
    assert runs["hicache"]["cache_phases_s"]["match"] > 0 and runs["no_cache"]["cache_phases_s"].get("plan", 0) == 0
    assert runs["no_cache"]["transfer_waits"] == {} and set(runs["hicache"]["transfer_waits"]) <= {"room", "pending_write"}
    for name in ("hicache", "device_only", "no_cache"):
        assert runs[name]["output_tokens"] == runs["hicache"]["output_tokens"]
        phases = runs[name]["phase_s"]     # the step's parts add up to the time the steps took
        assert set(phases) == {"cache_step", "schedule", "model", "advance"} and min(phases.values()) >= 0
        assert abs(sum(phases.values()) - runs[name]["busy_s"]) <= 0.01 + 0.01 * runs[name]["busy_s"]
        assert phases["model"] > 0
        cache_phases = runs[name]["cache_phases_s"]   # the cache's calls, timed inside the step's parts
        assert set(cache_phases) <= {"match", "plan", "dispatch", "wait"}
        assert sum(cache_phases.values()) <= phases["cache_step"] + phases["schedule"] + phases["advance"] + 0.01
        assert 0 < result["ttft_ms"][name]["p50"] <= result["ttft_ms"][name]["p99"]
        assert result["throughput_tok_s"][name] > 0
        profile = runs[name]["step_profile"]    # per step: the slow ones' parts add up to their time
        assert 0 < profile["step_ms"]["p50"] <= profile["step_ms"]["p99"] <= profile["step_ms"]["max"]
        assert set(profile["part_ms_p50"]) == set(phases) and profile["slow_steps"] < runs[name]["steps"]
        slow_ms = sum(profile["slow_part_ms"].values())
        assert profile["slow_excess_ms"] <= slow_ms and (profile["slow_steps"] > 0) == (slow_ms > 0)
        assert profile["slow_dispatch_ms"] + profile["slow_wait_ms"] <= slow_ms + 0.01
    assert runs["hicache"]["step_profile"]["programs_per_step"] > 0 == runs["no_cache"]["step_profile"]["programs_per_step"]
    assert set(result["ratios"]) == {"vs_device_only", "vs_no_cache"}


@pytest.mark.slow
def test_the_conversation_trace_on_the_cpu(capsys, tmp_path):
    """The CPU acceptance run: 48 requests of Mooncake's conversation trace, prompts cut to
    2048 tokens. Only their first block is shared, so the host hits are preempted requests
    coming back to the pages they left (`retract`), evicted meanwhile."""
    png, steps = tmp_path / "serve.png", tmp_path / "steps.json"
    code, result = run(capsys, "--trace", str(TRACE), "--config", str(CONFIGS / "tiny_v4.json"), "--limit", "48",
                       "--max-input-tokens", "2048", "--plot", str(png), "--steps-out", str(steps))
    assert code == 0 and result["schedule_ahead"] is True          # the default
    assert_served_well(result, 48)
    recorded = json.loads(steps.read_text())       # every step of every run, its parts adding up to its time
    fields = recorded["fields"]
    wall, parts = fields.index("wall_s"), [fields.index(f"{p}_s") for p in loop.PHASES]
    for name, rows in recorded["runs"].items():
        assert len(rows) == result["runs"][name]["steps"]
        assert all(abs(sum(r[i] for i in parts) - r[wall]) < 1e-6 for r in rows)
    assert result["runs"]["hicache"]["preemptions"] > 0
    assert png.read_bytes()[:8] == PNG


@pytest.mark.slow
def test_a_trace_it_has_not_seen_and_more_requests_compile_nothing(capsys, tmp_path):
    """Shared system prompt, multi-turn extensions: later turns find their conversation's
    pages on the host (evicted by the others). Six requests, then all eighteen, scheduled
    ahead: nothing compiles while serving either way."""
    trace = conversation_trace(tmp_path / "conversations.jsonl")
    common = ["--trace", str(trace), "--config", str(CONFIGS / "tiny_v4.json"), "--max-input-tokens", "2048",
              "--max-output-tokens", "4", "--max-batch", "4", "--device-pages", "20"]
    # six requests, the jnp kernels named, and admission that reserves a request's pages: none
    # preempted; by default no load compiles a fused program (nothing compiles in the background)
    # (and a cost model under which every load is worth it: recorded, nothing refused for it)
    code, few = run(capsys, *common, "--limit", "6", "--kernels", "reference", "--admission", "reserve",
                    "--recompute-us-per-token", "1000", "--load-overhead-us", "250", "--no-schedule-ahead")
    assert code == 0 and few["identical"] and few["compiles_while_serving"] == 0
    assert few["recompute_us_per_token"] == 1000 and few["load_overhead_us"] == 250
    assert "not_worth_it" not in few["runs"]["hicache"]["load_refusals"]
    assert few["admission"] == "reserve" and all(r["preemptions"] == 0 for r in few["runs"].values())
    assert few["kernels"] == "reference" and few["schedule_ahead"] is False
    assert few["fuse_after"] == 0 and few["runs"]["hicache"]["background_compiles"] == 0
    assert few["runs"]["hicache"]["fused_loads"] == 0 and few["runs"]["hicache"]["program_calls"]
    # all eighteen, each step scheduled while the device computes the one before (a step that
    # computes every slot: another program, compiled at warm-up), the same bits as alone
    png = tmp_path / "conversations.png"
    code, result = run(capsys, *common, "--plot", str(png), "--schedule-ahead")
    assert code == 0 and result["schedule_ahead"] is True
    assert_served_well(result, 18)
    assert result["runs"]["hicache"]["preemptions"] > 0
    hi = result["runs"]["hicache"]
    assert hi["hit_tokens"]["host"] > hi["resume_hit_tokens"]["host"]     # found by later turns, not only resumes
    assert hi["hit_tokens"]["device"] > 0
    assert png.read_bytes()[:8] == PNG


@pytest.mark.slow
def test_a_changed_bit_is_caught(capsys, tmp_path, monkeypatch):
    """One bit of one logit of the sampled requests, flipped in every run: not identical, exit 1."""
    real = loop.pick

    def flipped(logits, rows):
        tokens, digests, kept = real(logits, rows)
        kept = np.array(kept)
        kept.view(np.uint32)[:, 7] ^= 1
        return tokens, digests, kept

    monkeypatch.setattr(loop, "pick", flipped)
    trace = conversation_trace(tmp_path / "conversations.jsonl", conversations=2, turns=1)
    code, result = run(capsys, "--trace", str(trace), "--config", str(CONFIGS / "tiny_v4.json"),
                       "--max-input-tokens", "1024", "--max-output-tokens", "3", "--check", "1",
                       "--no-schedule-ahead")
    assert code == 1 and result["identical"] is False and result["identical_sample"] is False
    assert result["identical_across_runs"] is True      # the digests still agree: every run was changed alike


def test_the_cost_model_reaches_the_hicache_run_only():
    """`load_cost` (serve_trace's --recompute-us-per-token and --load-overhead-us) configures
    the HiCache run's cost model (tests/cache/test_api.py checks what it decides); the other
    runs have no host tier to load from."""
    lay = hc.build_layout(hc.load_model_config(CONFIGS / "tiny_v4.json"))
    cache = modes.make_cache(modes.CacheKind.HICACHE, lay, 8, 32, load_cost=(1e-6, 1e-3))
    assert (cache.config.recompute_seconds_per_token, cache.config.load_overhead_seconds) == (1e-6, 1e-3)
    default = modes.make_cache(modes.CacheKind.HICACHE, lay, 8, 32)
    assert (default.config.recompute_seconds_per_token, default.config.load_overhead_seconds) == (None, 0.0)
    for kind in (modes.CacheKind.DEVICE_ONLY, modes.CacheKind.NO_CACHE):
        assert modes.make_cache(kind, lay, 8, 32, load_cost=(1e-6, 1e-3)).config.host_pages == 0


def bad_trace(tmp_path) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
                    '{"timestamp": 5, "input_length": 600, "hash_ids": [0, 1]}\n')
    return str(path)


@pytest.mark.parametrize("flags,says", [
    (["--max-batch", "0"], "--max-batch must be >= 1, got 0"),
    (["--limit", "-3"], "--limit must be >= 1, got -3"),
    (["--check", "-1"], "--check must be >= 0, got -1"),
    (["--fuse-after", "-1"], "--fuse-after must be >= 0, got -1"),
    (["--kernels", "fastest"], "argument --kernels: invalid choice: 'fastest'"),
    (["--max-output-tokens", "0"], "--max-output-tokens must be >= 1, got 0"),
    (["--time-scale", "0"], "--time-scale must be a number > 0, got 0.0"),
    (["--time-scale", "nan"], "--time-scale must be a number > 0, got nan"),
    (["--recompute-us-per-token", "0"], "--recompute-us-per-token must be a number > 0, got 0.0"),
    (["--recompute-us-per-token", "inf"], "--recompute-us-per-token must be a number > 0, got inf"),
    (["--recompute-us-per-token", "2", "--load-overhead-us", "-5"],
     "--load-overhead-us must be a number >= 0, got -5.0"),
    (["--load-overhead-us", "300"], "--load-overhead-us needs --recompute-us-per-token"),
    (["--limit", "many"], "argument --limit: invalid int value: 'many'"),
    (["--chunk", "32"], "--chunk 32: only Gemma models take --chunk"),
    (["--device-pages", "3"], "--device-pages 3: the longest request needs 9 pages"),
    (["--window-policy", "sometimes"], "--window-policy sometimes:"),
    (["--plot", "/no/such/dir/x.png"], "--plot /no/such/dir/x.png: no directory"),
    (["--config", "configs/nope.json"], "--config configs/nope.json:"),
    (["--trace", "no/such/trace.jsonl"], "--trace no/such/trace.jsonl: no such file"),
    (["--trace", "BAD"], "bad.jsonl:2: field 'output_length' is missing"),
])
def test_bad_flags_end_the_run_with_one_line_before_any_work(flags, says, capsys, tmp_path):
    argv = {"--trace": str(TRACE), "--config": str(CONFIGS / "tiny_v4.json"), "--limit": "4",
            "--max-input-tokens": "2048"}
    for flag, value in zip(flags[::2], flags[1::2]):
        argv[flag] = bad_trace(tmp_path) if value == "BAD" else value
    with pytest.raises(SystemExit) as e:
        serve_trace.main([x for kv in argv.items() for x in kv])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert says in err and err.startswith("serve_trace.py: error: ")


@pytest.mark.slow
def test_gemma_270m_with_real_weights(capsys):
    """Gemma 3 270M (the GGUF weights chat.py loads), three requests batched: bit-identical
    to each request alone, nothing compiled while serving. Needs the `[gemma]` extra."""
    from examples.gemma.weights import PACKAGE_HINT, find_gguf
    try:
        path = find_gguf()
    except FileNotFoundError as e:
        pytest.fail(f"the Gemma example needs the [gemma] extra ({PACKAGE_HINT}): {e}")
    code, result = run(capsys, "--trace", str(TRACE), "--config", str(CONFIGS / "gemma3_270m.json"), "--gguf",
                       str(path), "--limit", "3", "--max-input-tokens", "768", "--max-output-tokens", "4",
                       "--max-batch", "3")
    assert code == 0 and result["identical"] is True and result["config"] == "gemma-3-270m"
    assert result["max_batch"] >= 2 and result["compiles_while_serving"] == 0 and result["chunk"] == 32
