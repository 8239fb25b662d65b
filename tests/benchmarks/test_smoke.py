"""The benchmarks keep working: each runs in its --smoke mode and writes its JSON."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRATCH = {".pytest_cache", ".hypothesis", "__pycache__"}   # ignored by git, made by the test run itself


@pytest.fixture(scope="module", autouse=True)
def nothing_is_left_in_the_repository_root():
    """Results go where --out says, or under benchmarks/results/: never into the root."""
    before = {p.name for p in ROOT.iterdir()}
    yield
    assert {p.name for p in ROOT.iterdir()} - before - SCRATCH == set()


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


@pytest.mark.slow
def test_bench_window_policy_smoke(tmp_path):
    result = run("bench_window_policy.py", tmp_path)
    runs = {r["window_policy"]: r for r in result["runs"]}
    assert set(runs) == {"every", "ends", result["default"]} and all(r["identical"] for r in runs.values())
    assert runs["every"]["window_pages_per_kv_page"] == 1.0 and runs["every"]["hit_rate"] > 0
    assert result["flash_page_bytes"] == {"kv": 998208, "swa": 8160000}


def test_bench_storage_smoke(tmp_path):
    result = run("bench_storage.py", tmp_path, "--dir", str(tmp_path / "disk"))
    backends = {r["backend"] for r in result["runs"]}
    assert {"ocdbt", "plain"} <= backends
    if os.environ.get("HICACHE_REQUIRE_MOONCAKE") == "1":
        assert "mooncake" in backends
    for r in result["runs"]:
        assert r["put_GBps"] > 0 and r["get_GBps"] > 0 and r["raw_write_GBps"] > 0 and r["raw_read_GBps"] > 0


@pytest.mark.slow
def test_bench_kernels_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--smoke", "--out", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    rows = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    assert {k.split("/")[-1] for k in rows} == {"mosaic_gpu", "triton", "xla"}
    assert all(r.get("exact") for r in rows.values()), rows


@pytest.mark.slow
def test_bench_api_smoke(tmp_path):
    result = run("bench_api.py", tmp_path)
    assert {r["pages"] for r in result["runs"]} == {1, 4}
    for r in result["runs"]:
        assert r["exact"] and r["acquire"]["ms"] > 0 and r["load_back"]["contiguous_ms"] > 0
        assert r["page_spread"] == 0 and r["first_pages_landed_on"] == 1


@pytest.mark.slow
def test_bench_api_page_spread_smoke(tmp_path):
    """With --page-spread the rounds' hits land on different device pages, and stay exact."""
    result = run("bench_api.py", tmp_path, "--page-spread", "4")
    for r in result["runs"]:        # 1 and 4 pages, rounds 0, 1, 2
        assert r["exact"] and r["page_spread"] == 4 and r["first_pages_landed_on"] == 3


def test_trace_one_page_smoke(tmp_path):
    result = run("trace_one_page.py", tmp_path)
    parts = result["median_us"]
    assert result["acquires"] == 3 and parts["acquire"] > parts["call"] > 0
    assert parts["index_device_put"] == 0     # a one-page hit hands XLA no host data: its indices are kept
    assert all(v is None or 0 <= v <= parts["acquire"] for v in parts.values())   # GPU-only parts are None here


def test_bench_gemma_chunk_smoke(tmp_path):
    result = run("bench_gemma_chunk.py", tmp_path, "--chunks", "16,64")
    assert [r["chunk"] for r in result["runs"]] == [16, 64]
    assert all(r["call_ms"] > 0 and r["no_head_ms"] > 0 for r in result["runs"])


@pytest.mark.slow
def test_bench_backup_decode_smoke(tmp_path):
    result = run("bench_backup_decode.py", tmp_path)
    assert result["exact"] and result["config"] == "tiny-v4"
    assert all(result["step_ms"][s] > 0 for s in ("none", "backup", "raw"))
    assert result["slowdown_backup"] > 0 and result["contiguous_GBps"] > 0
    assert all(r["backup"]["backup_bytes"] > 0 and r["none"]["backup_bytes"] == 0 for r in result["rounds"])


@pytest.mark.slow
def test_bench_host_tier_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_host_tier.py"), "--smoke", "--out", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    result = json.loads((tmp_path / "host_tier.json").read_text())
    cells = result["summary"]["0.02"]
    assert set(cells) == {"numpy_zeros", "numpy_empty", "compiled_rows", "jit_zeros", "jit_chunks",
                          "engine"}
    assert all(c["zeros_ok"] and c["s_per_gib"] > 0 for c in cells.values())
    assert all(r.get("host_compute", []) == [] and "error" not in r for r in result["runs"])
    assert all(r["first_device_step_s"] > 0 for r in result["runs"] if r["strategy"].startswith("engine"))
    assert result["jax"] and result["date"] and result["device"]


@pytest.mark.slow
def test_bench_overlap_smoke(tmp_path):
    result = run("bench_overlap.py", tmp_path)
    assert result["config"] == "tiny-v4" and result["matmuls_per_layer"] >= 1
    assert set(result["ms"]) == {"load", "compute", "serial", "cache/2", "load/2", "whole/2", "chained/2", "slices/2"}
    assert all(v > 0 for v in result["ms"].values()) and result["vs_max_load_compute"]["serial"] > 0
    assert result["byte_exact"] == {"2": True}   # the deferred load, landed by the step


def test_one_page_parts_smoke(tmp_path):
    """A one-page hit split at its load program's call, and the program called again alone.
    Only orderings that hold round by round are checked (a median of sums is not a sum of
    medians); which is faster is the benchmark's to say."""
    (r,) = run("one_page_parts.py", tmp_path)["runs"]
    assert r["exact"] == {"reference": True}
    assert r["ms"]["acquire_reference"] > 0 and r["ms"]["bare_reference"] > 0
    assert set(r["breakdown_ms"]["reference"]) == {"match", "plan", "dispatch", "wait", "other"}
    phases = r["phases_ms"]["reference"]
    assert all(v >= 0 for v in phases.values()) and phases["call"] > 0 and phases["bare_call"] > 0
    # each round's program call returns before its hit has landed, and follows the Python before it
    assert phases["before_call"] <= phases["to_call_return"] <= r["ms"]["acquire_reference"]
    assert phases["call"] <= phases["to_call_return"]
    assert set(r["call_ms"]) == {"load_program", "scatter_only", "copies_only", "trivial_jit"}
    assert all(v > 0 for v in r["call_ms"].values())


def test_api_ab_smoke(tmp_path):
    """This tree's one-page hit against a git revision's (here HEAD), both Python only."""
    result = run("api_ab.py", tmp_path)
    (r,) = result["runs"]
    assert result["base"] == "HEAD" and r["python_only"] and r["rounds"] == 20
    assert r["ms"]["base"] > 0 and r["ms"]["this"] > 0 and abs(r["paired_saving_ms"]["this"]) < r["ms"]["base"]
    assert r["ms"]["contiguous"] > 0 and r["first_pages_landed_on"] == {"base": 1, "this": 1}


def test_bench_hits_call_times_are_the_usual_rounds_medians():
    """`calls_ms`: per program call, the median over the rounds that made the usual number
    of calls, at most the first 8 (rounds of more calls are not dropped for it)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_hits
    ms = lambda *xs: [x / 1e3 for x in xs]
    assert bench_hits._calls_ms([]) == []
    assert bench_hits._calls_ms([ms(1, 2), ms(3, 4), ms(5), ms(2, 9)]) == [2.0, 4.0]
    many = [ms(*range(k, k + 10)) for k in (1, 2, 3)]
    assert bench_hits._calls_ms(many) == [float(k) for k in range(2, 10)]


def test_bench_hits_smoke(tmp_path):
    """Host hits as traffic shapes them (a whole backup, part of a write-back batch, a shared
    system prompt, fresh and hit again, two turns, first vs repeat, N requests): every one byte-exact, moving the
    bytes of its contiguous reference, with nothing compiled while timed."""
    out = tmp_path / "result.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_hits.py"), "--smoke", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result == json.loads(out.read_text()) and result["exact"] is True
    runs = result["runs"]
    assert {r["mode"] for r in runs} == {"whole_block", "write_back_batch", "shared_prompt", "shared_again",
                                         "multi_turn", "first_vs_repeat", "batched"}
    again = [r for r in runs if r["mode"] == "shared_again"]      # one backup, hit round after round
    assert again and all(r["backup_transfers"] == 1 and r["backed_up_pages"] == 2 * r["pages"] for r in again)
    assert {r["config"] for r in runs} == {"tiny-v4", "tiny-gqa"} and {r["pages"] for r in runs} == {1, 4}
    for r in runs:
        assert r["exact"] and r["bytes_as_expected"] and r["checked_hits"] > r["rounds"], r
        assert r["ratio"] > 0 and r["ms"] > 0 and r["contiguous_ms"] > 0, r
        # one device: after warm-up every hit, whole blocks or pieces of several, runs ONE program
        assert r["dispatches"] == 1 or r["mode"] == "batched", r
        assert r["compiles_in_timed_calls"] == 0, r
        side = r.get("hit") or r.get("acquire_many")      # host time: the first program call, then the return
        assert 0 < side["first_call_ms"] <= side["returned_ms"] <= side["ms"], side
        # each program's call, in order, all before the call returned
        calls = side["calls_ms"]
        assert 1 <= len(calls) <= max(8, side["dispatches"]) and 0 < calls[0], side
        assert calls == sorted(calls) and calls[-1] <= side["returned_ms"], side
        # how long each call held the host; the call's wait for the device ended before it returned
        assert len(side["held_ms"]) == len(calls) and all(h > 0 for h in side["held_ms"]), side
        assert calls[-1] < side["waited_ms"] <= side["returned_ms"], side
        if r["mode"] == "write_back_batch":      # one backup batch of 4 prompts; the hit is a quarter of it
            assert r["backup_transfers"] == 1 and r["backed_up_pages"] == 4 * r["hit_pages"]
        if r["mode"] == "shared_prompt":         # one node backed up; the hit is its first half
            assert r["backup_transfers"] == 1 and r["backed_up_pages"] == 2 * r["hit_pages"]
        if r["mode"] == "multi_turn":            # two turns' nodes demoted together, hit whole
            assert r["backup_transfers"] == 1 and sum(r["turn_pages"]) == r["hit_pages"]
        if r["mode"] == "first_vs_repeat":
            assert r["first_ms"] > 0 and r["first_over_repeat"] > 0 and r["first"]["ratio"] > 0
        if r["mode"] == "batched":
            assert r["one_by_one"]["dispatches"] >= r["batch"] and r["hit_pages"] == r["batch"] * r["pages"]
            assert r["acquire_many"]["ratio"] > 0 and r["acquire_many"]["dispatches"] == 1, r
    assert {r["batch"] for r in runs if r["mode"] == "batched"} == {1, 4}


def test_bench_gil_convoy_smoke(tmp_path):
    result = run("bench_gil_convoy.py", tmp_path, "--intervals", "0.005,0.0002")
    runs = result["runs"]
    assert [(r["switch_interval_ms"], r["background_lowering"]) for r in runs] == \
        [(5.0, False), (5.0, True), (0.2, False), (0.2, True)]
    assert all(r["step_ms_p50"] > 0 for r in runs)
    assert all(r["programs_lowered"] > 0 for r in runs if r["background_lowering"])


@pytest.mark.parametrize("flags", [["--intervals", "0"], ["--intervals", "fast"], ["--steps", "0"]])
def test_bench_gil_convoy_refuses_bad_flags(flags):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gil_convoy.py"), *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and flags[0] in r.stderr.splitlines()[-1]


def test_dispatch_ab_smoke(tmp_path):
    result = run("dispatch_ab.py", tmp_path)
    assert [r["pages"] for r in result["runs"]] == [1, 4]
    for r in result["runs"]:
        for tree in ("base", "this"):
            calls = r["ms_from_acquire"][tree]
            assert calls[-1]["call"] == "return" and len(calls) >= 2      # at least one program, then the return
            assert [c["ms"] for c in calls] == sorted(c["ms"] for c in calls) and calls[0]["ms"] > 0


def test_probe_host_reads_smoke(tmp_path):
    result = run("probe_host_reads.py", tmp_path, "--hlo-dir", str(tmp_path / "hlo"))
    assert result["exact"] and [(r["block_rows"], r["rows"]) for r in result["runs"]] == [(2, 1), (64, 1), (64, 16)]
    assert all(r["view_error"] is None and r["view_memory_kind"] for r in result["runs"])
    ways = result["runs"][2]["ways"]
    assert {"contiguous", "dynamic_slice", "static_slice", "block_then_slice", "split_slices",
            "granules_1", "granules_8", "granules_16", "list_put_1", "list_put_16", "view_put", "view_jit"} <= set(ways)
    assert all(w["ms_p50"] > 0 for w in ways.values())
    assert ways["split_slices"]["hlo"]["dynamic_slice"] >= 4        # the summary counts what XLA emitted
    assert (tmp_path / "hlo" / "dynamic_slice_16of64rows.hlo.txt").read_text().strip()


def test_probe_many_blocks_smoke(tmp_path):
    """benchmarks/probe_many_blocks.py: every way moves the blocks' bytes, each timed against one copy."""
    result = run("probe_many_blocks.py", tmp_path)
    assert result["exact"] is True and result["total_bytes"] == 3 * 4096 + 3 * 1024
    assert set(result["ways"]) == {"contiguous", "puts", "list_put", "one_jit", "one_jit_join", "two_programs"}
    assert all(w["ms_p50"] > 0 and ("ratio_p50" in w) == (name != "contiguous") for name, w in result["ways"].items())


@pytest.mark.parametrize("flags", [["--blocks", "16x6"], ["--blocks", "0x4096"], ["--blocks", "16"], ["--rounds", "0"]])
def test_probe_many_blocks_refuses_bad_flags(flags):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_many_blocks.py"), *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and flags[0] in r.stderr.splitlines()[-1]


@pytest.mark.parametrize("flags", [["--rows", "0"], ["--row-bytes", "6"], ["--rows", "40", "--block-rows", "64,16"]])
def test_probe_host_reads_refuses_bad_flags(flags):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_host_reads.py"), *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and flags[0] in r.stderr.splitlines()[-1]


def test_decode_table_reproduces_the_published_rows(tmp_path):
    """The H200 suite's results of 2026-12-04 (a2dfb05) give the rows BENCHMARKS.md shows."""
    cases = json.loads((ROOT / "benchmarks" / "results" / "gpu_suite_h200.json").read_text())["results"]
    lines = tmp_path / "decode_gpu.jsonl"
    lines.write_text("".join(json.dumps(c) + "\n" for c in cases))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_table.py"), str(lines),
                        "--out", str(tmp_path / "rows.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    table = r.stdout.splitlines()
    assert len(table) == 2 + len(cases)
    # (results of before the GC and the cache's calls were timed: their columns say "—")
    assert "| tiny_v4 | 9090 | 8/32 | write_through | blocking | yes | 0 | 0 | 5.7 / 7.9 / 7.9 | 1.38 | 1.43 | 5.6 | 5.2 " \
           "| — | — | 0 / 0 / — |" in [line.replace("tiny-v4", "tiny_v4") for line in table]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert sum(not row["identical"] for row in rows) == 10         # every grouped row of that commit
    held = sum(row["max_over_median"] <= 2 for row in rows)        # and the bound, said on stderr
    assert f"TTFT max <= 2 x median in {held} of {len(rows)} cases; over: " in r.stderr
    assert sum(row["recompute_max_over_median"] > 2 for row in rows) == 2   # counted from the raw TTFTs
    assert f"; the recompute runs (no cache, same processes) over it in 2 of {len(rows)}" in r.stderr
    assert all(row["ttft_ms"]["median"] <= row["ttft_ms"]["p99"] <= row["ttft_ms"]["max"] for row in rows)


def test_decode_table_refuses_an_empty_file(tmp_path):
    empty = tmp_path / "none.jsonl"
    empty.write_text("\n")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_table.py"), str(empty)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and str(empty) in r.stderr.splitlines()[-1]


def test_first_requests_smoke(tmp_path):
    """benchmarks/first_requests.py: one decode case served with each warm-up, phases timed."""
    result = run("first_requests.py", tmp_path)
    assert [r["warm_up"] for r in result["runs"]] == ["no_fetch", "fetch"]
    for r in result["runs"]:
        assert r["rc"] == 0 and r["identical"] and len(r["ttft_ms_cache"]) == 4
        assert r["first_prefill_ms"] > 0 and {name for _, _, name, _ in r["phases"]} >= {"acquire", "forward", "prefill"}


@pytest.mark.parametrize("flags", [["--cases", "9"], ["--cases", "x"], ["--requests", "1"]])
def test_first_requests_refuses_bad_flags(flags):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_requests.py"), *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and flags[0] in r.stderr


def test_profile_hits_smoke(tmp_path):
    """benchmarks/profile_hits.py: hits traced by the profiler, exact; a CPU trace has no device events."""
    result = run("profile_hits.py", tmp_path)
    assert [(r["mode"], r["pages"], r["batch"]) for r in result["runs"]] == [("shared_prompt", 4, 1), ("batched", 1, 4)]
    for r in result["runs"]:
        assert r["exact"] is True and r["ms"] > 0 and r["device_events"] == len(r["last_hit"]) == 0
    sides = result["runs"][1]["sides"]    # the batched mode keeps both sides: one acquire each, acquire_many
    assert sides["acquire_many"]["dispatches"] == 1 and sides["one_by_one"]["dispatches"] >= 4
    assert "sides" not in result["runs"][0]
    # the profiler keeps each timed call's mark (a CPU trace too): the sides' windows are found by them
    assert result["runs"][0]["marked"] == ["hit"] and result["runs"][1]["marked"] == ["acquire_many", "one_by_one"]
    # only the measured rounds are traced (one here), not the warm-up's calls and compilations
    assert result["runs"][0]["marked_calls"] == {"hit": 1}
    assert result["runs"][1]["marked_calls"] == {"acquire_many": 1, "one_by_one": 1}


def test_profile_hits_runs_given_override_the_smoke_runs(tmp_path):
    result = run("profile_hits.py", tmp_path, "--runs", "whole_block:1:1", "--early-copy-mb", "1000")
    assert [(r["mode"], r["pages"], r["batch"]) for r in result["runs"]] == [("whole_block", 1, 1)]
    assert result["runs"][0]["exact"] is True and result["runs"][0]["transfer"] == {"early_copy_bytes": 10 ** 9}


@pytest.mark.parametrize("flags", [["--runs", "batched:16"], ["--runs", "batched:x:16"], ["--runs", "nope:1:1"],
                                   ["--rounds", "0"]])
def test_profile_hits_refuses_bad_flags(flags):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_hits.py"), *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and flags[0] in r.stderr.splitlines()[-1]


def test_profile_hits_summarises_device_timelines():
    """The summary keeps accelerator events only, grouped by name, and the last hit's window."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import profile_hits
    from hit_requests import HIT_MARK
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(MemcpyH2D)"}},
        {"ph": "X", "name": "scatter", "pid": 1, "tid": 7, "ts": 100.0, "dur": 5.0},
        {"ph": "X", "name": "scatter", "pid": 1, "tid": 7, "ts": 30000.0, "dur": 7.0},
        {"ph": "X", "name": "memcpy", "pid": 1, "tid": 7, "ts": 29000.0, "dur": 900.0},
        {"ph": "X", "name": "python", "pid": 2, "tid": 1, "ts": 29500.0, "dur": 50.0}]}
    s = profile_hits.summarise(trace)
    assert s["device_events"] == 3 and s["anchor"] == "trace end"
    assert s["by_name"][0] == {"name": "memcpy", "count": 1, "median_us": 900.0, "total_us": 900.0}
    assert {"name": "scatter", "count": 2, "median_us": 6.0, "total_us": 12.0} in s["by_name"]
    assert [(w["name"], w["at_us"], w["stream"]) for w in s["last_hit"]] == \
        [("memcpy", -1007.0, "Stream #7(MemcpyH2D)"), ("scatter", -7.0, "Stream #7(MemcpyH2D)")]
    # with a load program on the timeline, the window ends with it, before the check's events
    trace["traceEvents"] += [{"ph": "X", "name": "jit_fused_load", "pid": 1, "tid": 7, "ts": 28000.0, "dur": 2000.0},
                             {"ph": "X", "name": "gather", "pid": 1, "tid": 7, "ts": 31000.0, "dur": 10.0}]
    s = profile_hits.summarise(trace)
    assert s["anchor"] == "jit_fused_load"
    assert [(w["name"], w["at_us"]) for w in s["last_hit"]] == [("jit_fused_load", -2000.0), ("memcpy", -1000.0)]
    # the host's call of a load program (a GPU names device events after fusions) starts the window
    trace["traceEvents"] += [{"ph": "X", "name": "PjitFunction(plan_load)", "pid": 2, "tid": 1, "ts": 29950.0,
                              "dur": 40.0}]
    s = profile_hits.summarise(trace)
    assert s["anchor"] == "host: PjitFunction(plan_load)"
    assert [(w["name"], w["at_us"]) for w in s["last_hit"]] == [("scatter", 50.0), ("gather", 1050.0)]
    trace["traceEvents"][-1] = {"ph": "X", "name": "Execute", "pid": 2, "tid": 1, "ts": 29950.0, "dur": 40.0,
                                "args": {"hlo_module": "jit_fused_load"}}       # the module in its arguments
    assert profile_hits.summarise(trace)["anchor"] == "host: Execute"
    # marked calls (hit_requests.Probe.time) give each side its own window, from just before its call to its end
    trace["traceEvents"] += [{"ph": "X", "name": HIT_MARK + "acquire_many", "pid": 2, "tid": 1, "ts": 28400.0, "dur": 1700.0},
                             {"ph": "X", "name": HIT_MARK + "one_by_one", "pid": 2, "tid": 1, "ts": 200.0, "dur": 100.0},
                             {"ph": "X", "name": HIT_MARK + "one_by_one", "pid": 2, "tid": 1, "ts": 90.0, "dur": 5.0}]
    s = profile_hits.summarise(trace)
    assert s["anchor"] == HIT_MARK + "acquire_many" and s["hits"]["acquire_many"]["call_us"] == 1700.0
    assert [(w["name"], w["at_us"]) for w in s["last_hit"]] == [("jit_fused_load", -400.0), ("memcpy", 600.0),
                                                               ("scatter", 1600.0)]
    assert [w["name"] for w in s["hits"]["one_by_one"]["events"]] == ["scatter"]      # the side's last call only
    # each stream of a side's window: its events, first start, last end, busy time (overlaps once)
    spans = [("a", 0.0, 10.0), ("a", 5.0, 10.0), ("a", 30.0, 5.0), ("b", -2.0, 1.0)]
    assert profile_hits.streams([{"stream": n, "at_us": at, "dur_us": d} for n, at, d in spans]) == {
        "a": {"count": 3, "first_us": 0.0, "last_end_us": 35.0, "busy_us": 20.0},
        "b": {"count": 1, "first_us": -2.0, "last_end_us": -1.0, "busy_us": 1.0}}
    assert set(s["hits"]["acquire_many"]["streams"]) == {w["stream"] for w in s["hits"]["acquire_many"]["events"]}
    # the host's events inside a marked call (the program calls of PjitFunction, Execute), not the mark itself
    assert [(w["name"], w["at_us"]) for w in s["hits"]["acquire_many"]["host"]] == [("python", 1100.0), ("Execute", 1550.0)]
    assert s["hits"]["one_by_one"]["host"] == [] and s["hits"]["acquire_many"]["program_calls"] == []
    trace["traceEvents"] += [{"ph": "X", "name": "PjitFunction(copy_many)", "pid": 2, "tid": 1, "ts": 28500.0, "dur": 30.0},
                             {"ph": "X", "name": "PjitFunction(tiny)", "pid": 2, "tid": 1, "ts": 28600.0, "dur": 3.0}]
    calls = profile_hits.summarise(trace)["hits"]["acquire_many"]["program_calls"]
    assert [(c["name"], c["at_us"], c["dur_us"]) for c in calls] == [("PjitFunction(copy_many)", 100.0, 30.0),
                                                                     ("PjitFunction(tiny)", 200.0, 3.0)]


@pytest.mark.slow
def test_cache_calls_smoke(tmp_path):
    """benchmarks/cache_calls.py: each cache call before a forward split into programs, device_puts,
    waits and Python; a write-back hit's acquire dispatches programs and hands rows to the host."""
    result = run("cache_calls.py", tmp_path)
    case, = result["decode"]
    calls = [c for g in case["before_forward"] for c in g["calls"]]
    assert {c["call"] for c in calls} == {"step", "acquire", "alloc"}
    for c in calls:      # the parts add up to the call
        parts = sum(c.get(k, 0) for k in ("program", "device_put", "block", "python"))
        assert c["ms"] == pytest.approx(parts, abs=0.01) and c["python"] >= -0.01
    assert any(c["call"] == "acquire" and c.get("n_program", 0) >= 1 and c.get("n_device_put", 0) >= 1 for c in calls)
    assert len(case["before_forward"]) >= len(case["cache_calls_ms_in_ttft"])
    many = result["acquire_many"]
    assert many["requests"] == 4 and len(many["rounds"]) == 2
    assert all(r["n_program"] == 1 and r["device_done_ms"] >= r["ms"] for r in many["rounds"])


def test_step_dispatch_smoke(tmp_path):
    result = run("step_dispatch.py", tmp_path)
    assert (result["batch"], result["count"], result["rounds"]) == (4, 3, 2)
    ways = result["ways"]
    assert {"traced", "static_cond", "static_all"} <= set(ways) and result["identical"] is True
    for w in ways.values():     # every way ran and gave the traced step's bits
        assert w["identical"] is True and 0 < w["dispatch_ms"] <= w["done_ms"]


@pytest.mark.parametrize("flags", [["--count", "0"], ["--count", "17"], ["--rounds", "0"]])
def test_step_dispatch_refuses_bad_flags(flags):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_dispatch.py"), *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and flags[0] in r.stderr.splitlines()[-1]
