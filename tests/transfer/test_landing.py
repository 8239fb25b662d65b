"""Deferred loads: a model step lands a load's host blocks layer group by layer group, and
the pools end up byte for byte as a blocking load leaves them."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.layout import groups as layer_groups
from hicache_jax.plan import make_plan
from hicache_jax.transfer import Landing, TransferEngine, host_compute_violations
from hicache_jax.transfer.blocks import _largest_blocks

from conftest import CONFIGS, tp_mesh


def engine_for(name, groups, kernels="reference", tp=None, max_deferred_blocks=3):
    layout = hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))
    allocators = [p.name for p in layout.allocator_pools if layout.moving_with(p.name)]
    mesh = tp_mesh(tp) if tp else None
    return layout, allocators, TransferEngine(layout, {a: 8 for a in allocators}, {a: 16 for a in allocators},
                                              mesh=mesh, kernels=kernels, layer_groups=groups,
                                              max_deferred_blocks=max_deferred_blocks)


def random_pools(engine, seed):
    rng = np.random.default_rng(seed)
    return {k: jax.device_put(rng.integers(0, 256, (*x.shape[:-1], x.shape[-1] * x.dtype.itemsize), np.uint8)
                              .view(x.dtype), x.sharding) for k, x in engine.init_device_pools().items()}


def as_bytes(pools):
    return {k: np.asarray(v).view(np.uint8).copy() for k, v in pools.items()}


def step_fn(num_layers, lead):
    """A step that lands `landing` before each layer and reads a byte of each pool per layer."""
    def step(pools, x, landing):
        lander = landing.lander(lead)
        for layer in range(num_layers):
            pools, x = lander.before_layer(layer, pools, x)
            x = x + sum(v[(layer % v.shape[0],) + (0,) * (v.ndim - 1)].astype(jnp.float32) for v in pools.values())
        return lander.finish(pools), x
    return jax.jit(step, donate_argnums=0)


@pytest.mark.parametrize("name, groups, lead, kernels, tp", [
    ("tiny_v4", 2, 1, "reference", None), ("tiny_v41", 3, 0, "reference", None),
    ("tiny_gqa", 2, 2, "triton_interpret", None), ("tiny_v4", 1, 1, "reference", None),
    ("tiny_gqa", 4, 1, "reference", 2)])   # tp: each rank lands its shard of the sharded pool
def test_a_step_lands_a_deferred_load_like_a_blocking_one(name, groups, lead, kernels, tp):
    layout, allocators, engine = engine_for(name, groups, kernels, tp)
    pools = random_pools(engine, 0)
    # back up whole runs (one block each) and a fragmented run, then load them to other pages
    backup = {a: (np.arange(4), np.arange(4, 8)) for a in allocators}
    _, h = engine.start(make_plan(layout, "backup", backup), pools)
    h.wait()
    _, h = engine.start(make_plan(layout, "backup", {allocators[0]: ([5, 6, 7], [0, 2, 9])}), pools)   # 3 blocks
    h.wait()
    load = {a: ([7, 2, 5, 1], np.arange(4, 8)) for a in allocators}   # whole blocks: a step lands them
    # pieces: rows 1-2 of a 4-page block (moved now, through staging) and three whole 1-page
    # blocks (landed by the step)
    load[allocators[0]] = ([7, 2, 5, 1, 0], [5, 6, 0, 9, 2])
    blocking, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1))
    h.wait()
    want = as_bytes(blocking)

    deferred, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1), deferred=True)
    landing = h.landing
    assert isinstance(landing, Landing) and landing.groups == groups and not h.done()
    assert len(landing.blocks) == len(allocators) - 1 + 3
    with pytest.raises(RuntimeError, match="no step has landed"):
        h.wait()
    num_layers = layer_groups.num_model_layers(layout)
    landed, _ = step_fn(num_layers, lead)(deferred, jnp.zeros(()), landing)
    h.landed(landed[next(iter(landed))])
    h.wait()
    got = as_bytes(landed)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)

    # a landing no step took: the engine lands it in one program, the same bytes
    again, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1), deferred=True)
    out = engine.land(h.landing, again)
    assert all(np.array_equal(v, want[k]) for k, v in as_bytes(out).items())
    jaxpr = jax.make_jaxpr(lambda p, l: l.lander().finish(p))(dict(out), h.landing)
    assert not host_compute_violations(jaxpr)


@pytest.mark.parametrize("cap, deferred_rows", [(1, [4]), (2, [4, 2]), (3, [4, 2, 1])])
def test_a_deferred_load_leaves_only_its_largest_blocks_to_the_step(cap, deferred_rows):
    """`max_deferred_blocks` bounds the landing shapes a step compiles for: the largest whole
    blocks of each allocator are deferred, the rest move at once; the bytes are the same."""
    layout, allocators, engine = engine_for("tiny_v4", 2, max_deferred_blocks=cap)
    pools = random_pools(engine, 0)
    for dev, host in (([0, 1, 2, 3], [0, 1, 2, 3]), ([4, 5], [4, 5]), ([6], [6])):   # kv blocks of 4, 2, 1 rows
        _, h = engine.start(make_plan(layout, "backup", {"kv": (dev, host), "swa": ([0], [0])}), pools)
        h.wait()
    load = {"kv": ([7, 6, 5, 4, 3, 2, 1], np.arange(7)), "swa": ([3], [0])}
    blocking, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1))
    h.wait()
    deferred, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1), deferred=True)
    rows = sorted((block[0].shape[0] for block in h.landing.blocks), reverse=True)
    assert rows == sorted(deferred_rows + [1], reverse=True)    # the kv blocks chosen, and swa's one
    landed, _ = step_fn(layer_groups.num_model_layers(layout), 1)(deferred, jnp.zeros(()), h.landing)
    h.landed(landed[next(iter(landed))])
    h.wait()
    want, got = as_bytes(blocking), as_bytes(landed)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_the_deferred_blocks_are_the_largest_wherever_they_are():
    """Across chunks, and whole chunks against whole-block pieces: the largest win, the
    first of equal ones."""
    rows = lambda n: (np.zeros((n, 1), np.uint8),)
    moves = [("pieces", [(rows(1), 0, 0, 0), (rows(4), 1, 1, 1), (rows(2), 0, 1, 3)]),   # 1 whole, 1 slice, 2 whole
             ("block", rows(8)), ("pieces", [(rows(2), 0, 1, 0)]), ("rows", rows(16))]   # "rows": a device copy
    assert _largest_blocks(moves, 1) == {(1, None)}
    assert _largest_blocks(moves, 2) == {(1, None), (0, 2)}
    assert _largest_blocks(moves, 4) == {(1, None), (0, 2), (2, 0), (0, 0)}
    assert _largest_blocks(moves, 9) == _largest_blocks(moves, 4)


def test_landing_misuse_is_refused():
    layout, allocators, engine = engine_for("tiny_v4", 2)
    pools = random_pools(engine, 0)
    plan = make_plan(layout, "backup", {a: (np.arange(2), np.arange(2)) for a in allocators})
    with pytest.raises(ValueError, match="only a load can be deferred"):
        engine.start(plan, pools, deferred=True)
    with pytest.raises(ValueError, match="deferred must be a bool"):
        engine.start(plan, pools, deferred="yes")
    _, h = engine.start(plan, pools)
    h.wait()
    pools, h = engine.start(make_plan(layout, "load", {a: (np.arange(2), np.arange(2)) for a in allocators}), pools,
                            deferred=True)
    with pytest.raises(ValueError, match="lead must be an int"):
        h.landing.lander(-1)
    with pytest.raises(ValueError, match="layer 99 is outside"):
        h.landing.needed_group(99)
    with pytest.raises(ValueError, match="land takes a Landing"):
        engine.land("landing", pools)
    for bad in (0, 10 ** 6, True, 1.5):
        with pytest.raises(ValueError, match="layer_groups must be an int"):
            TransferEngine(layout, {a: 8 for a in allocators}, {a: 16 for a in allocators}, layer_groups=bad)


def test_groups_cover_every_layer_once_and_reads_land_first():
    for name in ("tiny_v4", "tiny_v41", "tiny_gqa", "deepseek_v4_flash"):
        layout = hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))
        layers = layer_groups.num_model_layers(layout)
        for g in (1, 2, 3, layers):
            b = layer_groups.bounds(layout, g)
            assert b[0] == 0 and b[-1] == layers and all(x < y for x, y in zip(b, b[1:]))
            need = layer_groups.needed_groups(layout, g)
            for info in layout.layers:   # a layer's reads are in groups landed before it runs
                for src in (info.kv_source, info.index_keys):
                    if src is not None:
                        assert layer_groups.group_of(layout, g, src) <= need[info.layer]
            for p in layout.byte_pools:   # every slot of every pool in exactly one group
                covered = [s for lo, hi in zip(b, b[1:]) for s in range(*_span(layer_groups.slots(p, lo, hi)))]
                assert covered == list(range(p.num_layers)), (name, g, p.name)


def _span(first_n):
    first, n = first_n
    return first, first + n
