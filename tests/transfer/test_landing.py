"""Deferred loads: a model step lands a load's host blocks layer group by layer group, and
the pools end up byte for byte as a blocking load leaves them."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.layout import groups as layer_groups
from hicache_jax.plan import make_plan
from hicache_jax.config import TransferConfig
from hicache_jax.transfer import Landing, TransferEngine, host_compute_violations
from hicache_jax.transfer.blocks import _largest_block
from hicache_jax.transfer.moves import EarlyCopy, Piece, Pieces, WholeBlock

from conftest import CONFIGS, tp_mesh


def engine_for(name, groups, kernels="reference", tp=None, landing_buckets=4, view_bytes=None):
    """An engine over 8 device and 16 host pages of each allocator; no host views unless
    `view_bytes` says (a view of rows inside a block would be one more whole block to land)."""
    layout = hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))
    allocators = [p.name for p in layout.allocator_pools if layout.moving_with(p.name)]
    mesh = tp_mesh(tp) if tp else None
    return layout, allocators, TransferEngine(layout, {a: 8 for a in allocators}, {a: 16 for a in allocators},
                                              mesh=mesh,
                                              config=TransferConfig(kernels=kernels, layer_groups=groups,
                                                                    landing_buckets=landing_buckets,
                                                                    view_bytes=view_bytes))


def random_pools(engine, seed):
    rng = np.random.default_rng(seed)
    return {k: jax.device_put(rng.integers(0, 256, (*x.shape[:-1], x.shape[-1] * x.dtype.itemsize), np.uint8)
                              .view(x.dtype), x.sharding) for k, x in engine.init_device_pools().items()}


def as_bytes(pools):
    return {k: np.asarray(v).view(np.uint8).copy() for k, v in pools.items()}


def step_fn(num_layers, lead):
    """A step that lands `landing` before each layer and reads a byte of each pool per layer."""
    def step(pools, x, landing):
        schedule = landing.schedule(lead)
        for layer in range(num_layers):
            pools, x = schedule.before_layer(layer, pools, x)
            x = x + sum(v[(layer % v.shape[0],) + (0,) * (v.ndim - 1)].astype(jnp.float32) for v in pools.values())
        return schedule.finish(pools), x
    return jax.jit(step, donate_argnums=0)


@pytest.mark.parametrize("name, groups, lead, kernels, tp", [
    ("tiny_v4", 2, 1, "reference", None), ("tiny_v41", 3, 0, "reference", None),
    ("tiny_gqa", 2, 2, "triton_interpret", None), ("tiny_v4", 1, 1, "reference", None),
    ("tiny_gqa", 4, 1, "reference", 2)])   # tp: each rank lands its shard of the sharded pool
@pytest.mark.parametrize("views", [False, True])
def test_a_step_lands_a_deferred_load_like_a_blocking_one(name, groups, lead, kernels, tp, views):
    layout, allocators, engine = engine_for(name, groups, kernels, tp, view_bytes=0 if views else None)
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
    # one whole block of the anchor allocator (its whole blocks here are 1-page ones); the
    # rest, the slice of a 4-page block and the other allocators' blocks, moved now. With
    # views (one device), that slice is a 2-row block of its own: the largest, so the step's
    assert [block[0].shape[0] for block in landing.blocks] == [2 if views and tp is None else 1]
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
    jaxpr = jax.make_jaxpr(lambda p, l: l.schedule().finish(p))(dict(out), h.landing)
    assert not host_compute_violations(jaxpr)


@pytest.mark.parametrize("buckets, deferred_rows", [(1, None), (2, 4), (3, 4), (4, 4)])
def test_a_deferred_load_leaves_one_block_of_a_landing_size_to_the_step(buckets, deferred_rows):
    """`landing_buckets` bounds the landing shapes a step compiles for: the largest whole anchor
    block whose rows are a landing size is deferred, the rest moves at once (a load with no
    such block is an ordinary one); the bytes are the same."""
    layout, allocators, engine = engine_for("tiny_v4", 2, landing_buckets=buckets)
    assert engine.landing_sizes == tuple(8 >> i for i in range(buckets))[::-1]
    pools = random_pools(engine, 0)
    for dev, host in (([0, 1, 2, 3], [0, 1, 2, 3]), ([4, 5], [4, 5]), ([6], [6])):   # kv blocks of 4, 2, 1 rows
        _, h = engine.start(make_plan(layout, "backup", {"kv": (dev, host), "swa": ([0], [0])}), pools)
        h.wait()
    load = {"kv": ([7, 6, 5, 4, 3, 2, 1], np.arange(7)), "swa": ([3], [0])}
    blocking, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1))
    h.wait()
    want = as_bytes(blocking)
    deferred, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1), deferred=True)
    if deferred_rows is None:
        assert h.landing is None
        h.wait()
        landed = deferred
    else:
        assert [block[0].shape[0] for block in h.landing.blocks] == [deferred_rows]
        landed, _ = step_fn(layer_groups.num_model_layers(layout), 1)(deferred, jnp.zeros(()), h.landing)
        h.landed(landed[next(iter(landed))])
        h.wait()
    got = as_bytes(landed)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_the_deferred_block_is_the_largest_of_a_landing_size_wherever_it_is():
    """Across chunks, and whole chunks against whole-block pieces: the largest of the allowed
    sizes wins, the first of equal ones; slices and device copies never."""
    rows = lambda n: (np.zeros((n, 1), np.uint8),)
    moves = [Pieces((Piece(rows(1), 0, 0, 0), Piece(rows(4), 1, 1, 1), Piece(rows(2), 0, 1, 3))),  # whole, slice, whole
             WholeBlock(rows(8)), Pieces((Piece(rows(2), 0, 1, 0),)), EarlyCopy(rows(16))]         # a device copy
    assert _largest_block(moves, (1, 2, 4, 8, 16)) == (1, None)
    assert _largest_block(moves, (1, 2, 4)) == (0, 2)
    assert _largest_block(moves, (1,)) == (0, 0)
    assert _largest_block(moves, (16, 32)) is None


def test_every_landing_shape_is_compiled_at_warm_up():
    """A step run on each `landing_examples()` at warm-up compiles nothing when a real deferred
    load of any size comes later; the examples land nothing."""
    layout, allocators, engine = engine_for("tiny_v4", 2)
    engine.warmup()
    step = step_fn(layer_groups.num_model_layers(layout), 1)
    pools = random_pools(engine, 0)
    before = as_bytes(pools)
    for example in engine.landing_examples():
        pools, _ = step(pools, jnp.zeros(()), example)
    assert all(np.array_equal(v, before[k]) for k, v in as_bytes(pools).items())
    counter = hc.CompileCounter()
    for n in (1, 2, 4, 8):
        _, h = engine.start(make_plan(layout, "backup", {"kv": (np.arange(n), np.arange(n))}), pools)
        h.wait()
        pools, h = engine.start(make_plan(layout, "load", {"kv": (np.arange(n)[::-1], np.arange(n))}), pools,
                                deferred=True)
        assert [b[0].shape[0] for b in h.landing.blocks] == [n]
        pools, _ = step(pools, jnp.zeros(()), h.landing)
        h.landed(pools["deepseek_v4_c4"])
        h.wait()
    assert counter.names == []


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
        h.landing.schedule(-1)
    with pytest.raises(ValueError, match="layer 99 is outside"):
        h.landing.needed_group(99)
    with pytest.raises(ValueError, match="land takes a Landing"):
        engine.land("landing", pools)
    for bad in (0, 10 ** 6, True, 1.5):
        with pytest.raises(ValueError, match="layer_groups. must be an integer|layer_groups must be an int in"):
            TransferEngine(layout, {a: 8 for a in allocators}, {a: 16 for a in allocators},
                           config=TransferConfig(layer_groups=bad))


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


@pytest.mark.parametrize("groups, lead", [(1, 1), (2, 1), (4, 0), (4, 2)])
def test_a_landing_never_rebinds_the_activations(groups, lead):
    """The model's arithmetic traces the same with or without a landing: `before_layer` hands
    back the very activations it was given, whatever it lands. (Activations passed on through
    the landing's barriers split XLA's fusions at each group boundary; on a GPU the logits
    of such a step were rounded differently from the same step with no landing.)"""
    layout, allocators, engine = engine_for("tiny_v41", groups)
    pools = random_pools(engine, 0)
    _, h = engine.start(make_plan(layout, "backup", {"kv": (np.arange(4), np.arange(4))}), pools)
    h.wait()
    _, h = engine.start(make_plan(layout, "load", {"kv": (np.arange(4), np.arange(4))}), random_pools(engine, 1),
                        deferred=True)
    seen = []

    def step(pools, x, landing):
        schedule = landing.schedule(lead)
        for layer in range(layer_groups.num_model_layers(layout)):
            pools, y = schedule.before_layer(layer, pools, x)
            seen.append(y is x)
            x = jnp.tanh(x) * 1.5
        return schedule.finish(pools), x

    jax.make_jaxpr(step)(pools, jnp.ones(4), h.landing)
    assert seen and all(seen)


def test_step_compiler_options_turn_off_triton_gemms_on_gpus_only():
    assert hc.step_compiler_options("gpu") == {"xla_gpu_enable_triton_gemm": False}
    assert hc.step_compiler_options("cpu") == {} and hc.step_compiler_options("tpu") == {}
    assert hc.step_compiler_options() == hc.step_compiler_options(jax.devices()[0].platform)
    hc.step_compiler_options("gpu")["xla_gpu_enable_triton_gemm"] = True     # a copy: the next call is unchanged
    assert hc.step_compiler_options("gpu") == {"xla_gpu_enable_triton_gemm": False}
    with pytest.raises(ValueError, match="platform must be a str"):
        hc.step_compiler_options(0)
    # XLA takes the GPU options on any backend: a step compiled with them runs here
    step = jax.jit(lambda x: x @ x, compiler_options=hc.step_compiler_options("gpu"))
    assert float(step(jnp.eye(4)).sum()) == 4.0
