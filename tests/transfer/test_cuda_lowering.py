"""Every transfer program the engine runs also lowers for an NVIDIA GPU with the Mosaic GPU
kernels, checked on any machine.

jax lowers a program for a platform it does not have (`lower(lowering_platforms=("cuda",))`),
and Pallas lowers each kernel to Mosaic GPU then, so a kernel that cannot take a shape the
engine asks for (a block of rows, a piece of a block, the layers of one group) fails here,
before a GPU sees it. XLA's GPU compiler does not run: what it alone rejects still needs
`pytest -m gpu`.

The shapes are the ones an engine with the reference kernels compiles while it warms up and
moves random plans (whole blocks, pieces through staging, fused loads of pieces, early
copies, one by one and together); each is built again by an engine with the Mosaic GPU kernels and lowered. A step
landing a deferred load (every landing size) is lowered the same way.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hicache_jax.layout import groups as layer_groups
from hicache_jax.transfer import TransferEngine, compile_cache
from hicache_jax.transfer.programs import Program

from test_landing import step_fn
from test_round_trip import DEVICE_PAGES, HOST_PAGES, Harness

pytestmark = pytest.mark.slow
KERNEL_PROGRAMS = {Program.PACK, Program.UNPACK, Program.LOAD_BLOCK, Program.LOAD_PIECES}


def for_cuda(fn, args, donate, outs):
    """The StableHLO text of `fn` lowered for CUDA (its example args carry their shardings)."""
    ins = tuple(jax.tree.map(lambda a: a.sharding, args))
    traced = jax.jit(fn, in_shardings=ins, out_shardings=outs, donate_argnums=donate).trace(*args)
    return traced.lower(lowering_platforms=("cuda",)).as_text()


KERNEL_PRIMITIVES = {"mpmd_map", "pallas_call"}      # a Mosaic GPU kernel's call, in a jaxpr


def misaligned_kernel_inputs(fn, args) -> list[str]:
    """The kernel inputs of `fn` that are a static slice of a larger array starting off a
    256-byte boundary. XLA turns a slice of 256 bytes or more into a dynamic-slice fusion
    that hands the kernel a pointer into the array, and a Mosaic GPU kernel refuses an input
    that is not 256-byte aligned (a plan program's joined page index did, BENCHMARKS.md)."""
    bad = []

    def walk(jaxpr, offsets: dict) -> None:          # offsets: var -> bytes into the array it slices
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name == "slice" and (eqn.params["strides"] is None or set(eqn.params["strides"]) == {1}):
                x, start, limit = eqn.invars[0].aval, eqn.params["start_indices"], eqn.params["limit_indices"]
                if all(s == 0 and l == n for s, l, n in zip(start[1:], limit[1:], x.shape[1:])):   # contiguous
                    step = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
                    offsets[eqn.outvars[0]] = offsets.get(eqn.invars[0], 0) + start[0] * step
            if name in KERNEL_PRIMITIVES:
                bad.extend(f"{name} input {i}: {v.aval} at byte {offsets[v]}" for i, v in enumerate(eqn.invars)
                           if offsets.get(v, 0) % 256)
            for sub in eqn.params.values():
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):           # a call's body takes the call's arguments in order
                    mapped = len(inner.invars) == len(eqn.invars)
                    walk(inner, {iv: offsets[ov] for iv, ov in zip(inner.invars, eqn.invars)
                                 if mapped and ov in offsets})

    walk(jax.make_jaxpr(fn)(*args).jaxpr, {})
    return bad


def move_random_plans(t: Harness, seed: int) -> None:
    """Backups and loads of random pages (whole runs, pieces), each load shape twice so its
    fused program is compiled and used; then a run inside a block, copied early."""
    rng = np.random.default_rng(seed)
    t.engine._early.early_bytes = 0                   # every run inside a block may be copied early
    for _ in range(3):
        pages = {}
        for a in t.allocators:
            n = int(rng.integers(1, t.engine.chunk_pages(a) + 1))
            pages[a] = (rng.permutation(DEVICE_PAGES)[:n], np.sort(rng.permutation(HOST_PAGES)[:n]))
        t.run("backup", pages)
        for _ in range(2):
            hit = {a: (rng.permutation(DEVICE_PAGES)[:len(h)], h) for a, (_, h) in pages.items()}
            t.run("load", hit)
            compile_cache.wait_background()
        inside = {a: (d[1:], h[1:]) for a, (d, h) in pages.items() if len(h) > 2}
        if inside:                                    # parts of the batch's blocks
            t.run("load", inside)
            compile_cache.wait_background()
    a = t.layout.anchor.name                          # a run inside one block, copied ahead of its load
    n = t.engine.chunk_pages(a)
    t.run("backup", {a: (np.arange(n), np.arange(HOST_PAGES - n, HOST_PAGES))})
    hit = np.arange(HOST_PAGES - n + 1, HOST_PAGES)   # all but its first row
    for _ in range(2):                                # the second load runs the fused program on the copies
        assert t.engine.copy_early(a, hit.size, lambda: hit)
        t.run("load", {a: (np.arange(hit.size), hit)})
        compile_cache.wait_background()
    t.run("backup", {a: (np.arange(n), np.arange(HOST_PAGES - 2 * n, HOST_PAGES - n))})
    blocks = [np.arange(HOST_PAGES - 2 * n, HOST_PAGES - n), np.arange(HOST_PAGES - n, HOST_PAGES)]
    for _ in range(2):                                # two whole blocks in one program (compiled, then run)
        t.engine.copy_early_many(a, [(n, lambda b=b: b) for b in blocks])
        compile_cache.wait_background()
        t.run("load", {a: (np.arange(n), blocks[1])})   # from its early copy


@pytest.mark.parametrize("name, groups", [("tiny_v4", 2), ("tiny_v41", 3), ("tiny_gqa", 1)])
def test_every_program_the_engine_runs_lowers_for_cuda_with_the_mosaic_kernels(name, groups):
    ran = Harness(name, None, "reference", groups)
    ran.engine.warmup()
    move_random_plans(ran, seed=groups)
    # the same engine on the Mosaic GPU kernels: it builds and lowers programs, never runs one
    gpu_engine = TransferEngine(ran.layout, {a: DEVICE_PAGES for a in ran.allocators},
                                {a: HOST_PAGES for a in ran.allocators},
                                config=dataclasses.replace(ran.engine.config, kernels="mosaic_gpu"))
    assert gpu_engine.kernels == "mosaic_gpu"
    lowered = {}
    for a in ran.allocators:
        for key in ran.engine._programs[a]._cache:
            built = gpu_engine._programs[a].build(*key)
            text = for_cuda(*built)
            bad = misaligned_kernel_inputs(*built[:2])
            assert not bad, (a, key, bad)
            lowered[f"{a}:{key[0]}{list(key[1:])}"] = text
            if key[0] in KERNEL_PROGRAMS:
                assert "mosaic_gpu" in text, f"{a}:{key}: no Mosaic GPU kernel in the lowered program"
    plans, shared = ran.engine._plan_programs, 0    # shared: pieces unpacked by a kernel lowered for another
    for key, label in plans._labels.items():
        backup, runs = key
        if label.startswith("plan:load_pieces"):
            built = gpu_engine._plan_programs._build_fused(runs)
        else:
            built = gpu_engine._plan_programs._build(backup, runs, Program.PACK if backup else Program.LOAD_BLOCK)
        lowered[label] = text = for_cuda(*built)
        bad = misaligned_kernel_inputs(*built[:2])
        assert not bad, (label, bad)
        assert "mosaic_gpu" in text, f"{label}: no Mosaic GPU kernel in the lowered program"
        if label.startswith("plan:load_pieces"):
            # one kernel per allocator, stored part and piece size, however many pieces: each
            # kernel costs Python time to lower, and these programs compile while requests are served
            kernels = sum(len(ran.engine.host.formats[a].parts) * (len({k for _, k, _ in e[1]}) if e[0] is
                          Program.LOAD_PIECES else 1) for a, _, e in runs)
            assert text.count("custom_call @mosaic_gpu") == kernels, (label, text.count("custom_call @mosaic_gpu"))
            assert "stablehlo.concatenate" not in text, f"{label}: the pieces' rows are joined before the unpack"
            shared += sum(len(e[1]) - len({k for _, k, _ in e[1]}) for _, _, e in runs if e[0] is Program.LOAD_PIECES)
    assert shared, "no load of pieces had two of one size"
    names = {label.split("[")[0].split(":")[-1] for label in lowered}
    assert {"pack", "unpack", "load_block", "h2d", "copy", "copy_many", "load_pieces"} <= names, sorted(names)
    assert any(label.startswith("plan:load_pieces") and "True" in label for label in lowered)   # early copies

    step = step_fn(layer_groups.num_model_layers(ran.layout), 1)
    pools = gpu_engine.init_device_pools()
    for landing in gpu_engine.landing_examples():
        text = step.trace(pools, jnp.zeros(()), landing).lower(lowering_platforms=("cuda",)).as_text()
        assert "mosaic_gpu" in text and "pinned_host" in text


def test_a_plan_program_whose_index_slices_start_off_256_bytes_is_caught(monkeypatch):
    """The check above on the bug it pins: a backup of two allocators in one program, the
    second allocator's 64 pages 8 bytes into the joined index (the layout before
    `INDEX_ALIGN`), and the same program as built now."""
    from hicache_jax.transfer import index_layout
    t = Harness("tiny_v4", None, "mosaic_gpu", 1)
    runs = tuple((a, 2 if a == t.layout.anchor.name else 64) for a in sorted(t.allocators))
    assert len(runs) == 2
    build = lambda: t.engine._plan_programs._build(True, runs, Program.PACK)[:2]
    assert not misaligned_kernel_inputs(*build())
    monkeypatch.setattr(index_layout, "INDEX_ALIGN", 1)
    found = misaligned_kernel_inputs(*build())
    assert found and all("at byte 8" in f for f in found), found


def test_a_load_of_pieces_whose_index_slices_start_off_256_bytes_is_caught(monkeypatch):
    """The same for a fused load of pieces: each piece's pages start at a 256-byte boundary of
    its allocator's index (`aligned_offsets`); packed one after another they would not."""
    from hicache_jax.transfer import index_layout
    t = Harness("tiny_v4", None, "mosaic_gpu", 1)
    a = t.layout.anchor.name
    entries = ((a, 8, (Program.LOAD_PIECES, ((4, 2, False), (2, 1, False), (1, 0, False), (1, 0, True)))),)
    build = lambda: t.engine._plan_programs._build_fused(entries)[:2]
    assert not misaligned_kernel_inputs(*build())
    monkeypatch.setattr(index_layout, "INDEX_ALIGN", 1)
    found = misaligned_kernel_inputs(*build())
    assert [f.split(" at byte ")[1] for f in found] == ["16", "24", "28"], found
