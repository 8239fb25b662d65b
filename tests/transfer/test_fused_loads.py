"""A load whose chunks gather pieces of several host blocks (a hit on part of a block, or
several requests' hits merged) runs as ONE program once that program is compiled: the
first load of a shape moves by the per-chunk programs while the fused one compiles on the
background thread; every later load of the shape runs it. Both paths move the same bytes
and touch nothing outside the plan (`Harness.run` checks every page of both tiers)."""
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.transfer import compile_cache, plan_programs

from test_round_trip import DEVICE_PAGES, HOST_PAGES, Harness

FUSED = "plan:load_pieces"


def record(t):
    calls = []
    def hook(label, program, *args):
        if ":read[" not in label:             # the harness reads host pages back to check them
            calls.append(label)
        return program(*args)
    t.engine.on_program_call(hook)
    return calls


@pytest.mark.parametrize("case", [("tiny_v4", None, "reference"), ("tiny_v41", None, "triton_interpret", 2),
                                  ("tiny_gqa", None, "reference")], ids=lambda c: "-".join(map(str, c)))
def test_random_loads_of_pieces_move_the_same_bytes_before_and_after_their_program_compiles(case):
    t = Harness(*case)
    calls = record(t)
    rng = np.random.default_rng(3)
    fused_runs = 0
    for _ in range(4):
        pages = {}
        for a in t.allocators:
            n = int(rng.integers(2, 7))       # one chunk of the harness's staging (8 kv, 2 SWA pages)
            n = min(n, t.engine.chunk_pages(a))
            pages[a] = (rng.permutation(DEVICE_PAGES)[:n], np.sort(rng.permutation(HOST_PAGES)[:n]))
        t.run("load", pages)                  # per chunk, or fused if this shape compiled before
        compile_cache.wait_background()
        calls.clear()
        shuffled = {a: (rng.permutation(DEVICE_PAGES)[:len(d)], h) for a, (d, h) in pages.items()}
        t.run("load", shuffled)               # the same shape: its fused program is ready
        assert len(calls) == 1 and calls[0].startswith(FUSED), calls
        fused_runs += 1
    t.check()
    assert fused_runs == 4


def test_a_hit_on_part_of_a_block_runs_one_program_after_the_first():
    t = Harness("tiny_v4", None, "reference")
    t.run("backup", {"kv": (list(range(8)), list(range(16, 24))), "swa": ([2, 3], [4, 5])})   # one block each
    calls = record(t)
    for round_ in range(3):
        calls.clear()
        t.run("load", {"kv": ([9 - round_, 10], [18, 19]), "swa": ([round_], [5])})   # rows 2-3 of the kv block
        if round_:
            assert calls == [calls[0]] and calls[0].startswith(FUSED), calls
        compile_cache.wait_background()


@pytest.mark.parametrize("fuse_after", [2, 3, 0])
def test_a_shape_gets_its_program_only_once_it_has_been_seen_fuse_after_times(fuse_after, monkeypatch):
    """Shapes that come once (most of them, under traffic) compile nothing; the
    `fuse_after`-th load of a shape starts its compilation, the next one runs it; 0: never.
    Only the most recently seen shapes are counted."""
    monkeypatch.setattr(plan_programs, "SIGHTINGS_KEPT", 3)
    monkeypatch.setattr(compile_cache, "_COMPILED", {})   # none of the process's programs: this test's own
    monkeypatch.setattr(compile_cache, "_pending", {})
    t = Harness("tiny_v4", None, "reference", fuse_after=fuse_after)
    t.run("backup", {"kv": (list(range(8)), list(range(16, 24)))})     # one block of 8 rows
    calls = record(t)
    compiled = lambda: [k for k in t.engine.compiled_programs() if k.startswith(FUSED)]
    for once in ([16], [16, 17, 18], [20, 21, 22, 23], [17, 18, 19, 20, 21]):   # four shapes, each once
        t.run("load", {"kv": (np.arange(len(once)), once)})
        compile_cache.wait_background()
    assert not compiled()
    hit = [18, 19]                                                      # rows 2-3 of the block: a piece
    for k in range(1, max(fuse_after, 1) + 2):
        calls.clear()
        t.run("load", {"kv": (np.arange(2) + k, hit)})
        compile_cache.wait_background()
        fused = len(calls) == 1 and calls[0].startswith(FUSED)
        assert fused == (fuse_after > 0 and k > fuse_after), (k, calls)
    assert len(compiled()) == (1 if fuse_after else 0)
    assert len(t.engine._plan_programs._sightings) <= 3
    t.check()


def test_background_compilations_are_counted_apart_from_the_ones_a_caller_waits_for():
    counter = hc.CompileCounter()
    t = Harness("tiny_gqa", None, "reference")
    waited = counter.count                    # building the harness compiles on this thread
    rng = np.random.default_rng(11)
    # one chunk (the harness's GQA chunk is 2 pages) of two one-row pieces
    pages = {a: (rng.permutation(DEVICE_PAGES)[:2], np.array([1, 3])) for a in t.allocators}
    t.run("load", pages)
    compile_cache.wait_background()
    assert not any("fused_load" in n for n in counter.names[waited:])   # never on the caller's thread
    assert (counter.background > 0) == (counter.background_s > 0)     # each one's XLA seconds summed
    calls = record(t)
    t.run("load", pages)
    assert len(calls) == 1 and calls[0].startswith(FUSED)


@pytest.mark.parametrize("case", [("tiny_v4", None, "reference"), ("tiny_v4", None, "reference", 3)],
                         ids=lambda c: "-".join(map(str, c)))
def test_pieces_copied_early_are_unpacked_by_the_fused_program_and_dropped_without_it(case):
    """A large run inside a block starts its pieces' copies ahead (`copy_early`, or the
    load's start); the fused program unpacks the copies; without a fused program yet, the
    load moves from the host blocks and the copies are dropped. Exact every time."""
    t = Harness(*case)
    t.engine._early.early_bytes = 0                   # every piece is large enough
    t.run("backup", {"kv": (list(range(8)), list(range(16, 24)))})     # one block of 8 rows
    calls = record(t)
    hit = np.arange(18, 24)                           # rows 2..7: pieces of 4 and 2 rows
    for round_ in range(3):
        calls.clear()
        assert t.engine.copy_early("kv", hit.size, lambda: hit)
        assert len(t.engine._early._pending) == 2
        t.run("load", {"kv": (np.arange(6) + round_, hit)})
        assert not t.engine._early._pending           # taken by the load, used or dropped
        if round_:                                    # compiled in the background after the first
            assert len(calls) == 1 and calls[0].startswith(FUSED) and "True" in calls[0], calls
            assert "kv:read[8, 2]" in t.engine.program_jaxprs()
        compile_cache.wait_background()
    t.check()


def test_an_early_copy_is_only_made_of_pieces_a_load_would_cut():
    t = Harness("tiny_v4", None, "reference")
    t.engine._early.early_bytes = 0
    t.run("backup", {"kv": ([0, 1, 2, 3], [8, 9, 10, 11])})
    t.run("backup", {"kv": ([4, 5, 6, 7], [12, 13, 14, 15])})
    across = np.arange(10, 14)                        # two blocks: the load's pieces would not match
    assert not t.engine.copy_early("kv", across.size, lambda: across)
    t.run("load", {"kv": (np.arange(4), across)})
    assert not t.engine._early._pending


def test_a_background_compile_shortens_the_gil_switch_interval_while_it_runs():
    """A serving thread waits for the GIL up to the switch interval after each of its waits
    while the background thread lowers a program (compile_cache's docstring)."""
    seen = []

    def build():
        seen.append(sys.getswitchinterval())
        return (lambda x: x + 1), (jnp.zeros((3,), jnp.int32),), (), None

    compile_cache.wait_background()                                # none of another test's in flight
    before = sys.getswitchinterval()
    assert before > compile_cache.BACKGROUND_SWITCH_INTERVAL_S      # the interpreter's default, 5 ms
    assert compile_cache.ready_program(("switch-interval test", before), "test:switch", {}, build) is None
    compile_cache.wait_background()
    assert seen == [pytest.approx(compile_cache.BACKGROUND_SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == before                        # given back afterwards
    # a value someone sets meanwhile is kept
    sys.setswitchinterval(0.001)
    try:
        def build_and_set():
            sys.setswitchinterval(0.003)
            return build()
        compile_cache.ready_program(("switch-interval test 2", before), "test:switch2", {}, build_and_set)
        compile_cache.wait_background()
        assert sys.getswitchinterval() == pytest.approx(0.003)
    finally:
        sys.setswitchinterval(before)
