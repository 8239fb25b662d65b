"""The engine's contract: construction checks, pool checks, handles, errors before moving."""
import dataclasses
import os
import subprocess
import sys
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.plan import make_plan
from hicache_jax.pools import ROW_ALIGN_BYTES
from hicache_jax.config import TransferConfig
from hicache_jax.transfer import TransferEngine, hlo_host_ops, host_compute_violations

from conftest import CONFIGS, ROOT, other_device, tp_mesh


def layout_of(name):
    return hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))


@pytest.fixture(scope="module")
def v4():
    layout = layout_of("tiny_v4")
    return layout, TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8})


def test_pools_have_the_documented_shapes_dtypes_and_shardings(v4):
    layout, engine = v4
    pools = engine.init_device_pools()
    assert sorted(pools) == sorted(p.name for p in layout.byte_pools)
    for spec in layout.byte_pools:
        pages = 8 if spec.allocator == "kv" else 4
        assert pools[spec.name].shape == (spec.num_layers, pages, *spec.page_shape)
        assert pools[spec.name].dtype == jnp.dtype(spec.dtype)
    engine.check_device_pools(pools)
    # host rows: one page of every pool moving with the allocator, all layers, padded so
    # that every host page starts ROW_ALIGN_BYTES-aligned
    data = layout.page_bytes_of("kv")
    _, handle = engine.start(make_plan(layout, "backup", {"kv": ([5, 6, 7, 0], [8, 9, 10, 11])}), pools)
    handle.wait()
    table = engine.host.tables["kv"]  # one pinned block for the one host run
    ((block,),) = table.arrays.values()   # one block of one part (no layer groups)
    assert block.shape == (4, -(-data // ROW_ALIGN_BYTES) * ROW_ALIGN_BYTES) and table.rows == 4
    assert data % ROW_ALIGN_BYTES and block.shape[1] - data < ROW_ALIGN_BYTES
    assert block.sharding.memory_kind == "pinned_host"
    assert table.segments(6, 8) == [(-1, 0, 2), (next(iter(table.arrays)), 0, 4), (-1, 0, 2)]


def test_tp_pools_are_sharded_and_host_rows_split_per_rank():
    layout = layout_of("tiny_gqa")
    mesh = tp_mesh(4)
    engine = TransferEngine(layout, {"kv": 4}, {"kv": 8}, mesh=mesh)
    pool = engine.init_device_pools()["gqa_kv"]
    assert pool.sharding.spec[3] == "tp" and pool.addressable_shards[0].data.shape[3] == 2  # 8 heads / 4
    (host,) = engine.host.block("kv", 8)
    assert host.sharding.spec == jax.sharding.PartitionSpec(None, "tp") and len(host.addressable_shards) == 4
    with pytest.raises(ValueError, match="cannot be split over tp=3"):
        TransferEngine(layout, {"kv": 4}, {"kv": 8}, mesh=tp_mesh(3))
    with pytest.raises(ValueError, match="axes must be exactly"):
        TransferEngine(layout, {"kv": 4}, {"kv": 8}, mesh=tp_mesh(2, "x"))


def test_check_device_pools_names_the_pool_and_the_problem(v4):
    _, engine = v4
    pools = engine.init_device_pools()
    c4 = "deepseek_v4_c4"
    cases = [
        ({k: v for k, v in pools.items() if k != c4}, "lack"),
        ({**pools, "extra": pools[c4]}, "unexpected"),
        ({**pools, c4: pools[c4][:, :4]}, f"pool '{c4}' has shape"),
        ({**pools, c4: pools[c4].astype(jnp.int8)}, f"pool '{c4}' has dtype"),
        ({**pools, c4: np.asarray(pools[c4])}, "not a jax.Array"),
        ({**pools, c4: jax.device_put(pools[c4], other_device(pools[c4]))}, "sharding"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            engine.check_device_pools(bad)
    dead = {**pools, c4: pools[c4] + 0}
    dead[c4].delete()  # as if donated to an earlier call
    with pytest.raises(ValueError, match="deleted"):
        engine.check_device_pools(dead)


def test_pools_a_load_returned_are_checked_again_when_they_come_back(v4):
    """The engine trusts its own programs' outputs (placed by construction), but a deleted
    one, a swapped one or a changed mapping is still refused."""
    layout, engine = v4
    pools = engine.init_device_pools()
    pools, h = engine.start(make_plan(layout, "backup", {"kv": ([0], [0]), "swa": ([0], [0])}), pools)
    h.wait()
    load = make_plan(layout, "load", {"kv": ([1], [0]), "swa": ([1], [0])})
    pools, h = engine.start(load, pools)
    h.wait()
    engine.check_device_pools(pools)
    c4 = "deepseek_v4_c4"
    for bad, message in [({**pools, c4: pools[c4][:, :4]}, "has shape"),
                         ({k: v for k, v in pools.items() if k != c4}, "lack"),
                         ({**pools, "extra": pools[c4]}, "unexpected")]:
        with pytest.raises(ValueError, match=message):
            engine.check_device_pools(bad)
    pools[c4].delete()
    with pytest.raises(ValueError, match="deleted"):
        engine.check_device_pools(pools)
    with pytest.raises(ValueError, match="deleted"):
        engine.start(load, pools)


def test_pools_a_step_returned_are_checked_whole_once_then_for_liveness(v4, monkeypatch):
    """A model step's outputs pass the whole check once (when the loop hands them back), are
    then trusted by identity, and a bad or deleted array after them is still refused."""
    from hicache_jax.pools import device_pools
    _, engine = v4
    step = jax.jit(lambda pools: {k: v + 0 for k, v in pools.items()})
    pools = step(engine.init_device_pools())
    c4 = "deepseek_v4_c4"
    checked, real = [], device_pools._check_array

    def counting(spec, *rest):
        checked.append(spec.name)
        real(spec, *rest)
    monkeypatch.setattr(device_pools, "_check_array", counting)
    engine.check_device_pools(pools)
    assert sorted(checked) == sorted(pools)          # every array checked whole, once
    engine.check_device_pools(dict(pools))           # the same arrays in a new mapping: liveness only
    assert len(checked) == len(pools)
    for bad, message in [({**pools, c4: pools[c4][:, :4]}, "has shape"),
                         ({**pools, c4: pools[c4].astype(jnp.int8)}, "has dtype"),
                         ({**pools, "extra": pools[c4]}, "unexpected")]:
        with pytest.raises(ValueError, match=message):
            engine.check_device_pools(bad)
    engine.check_device_pools(pools)                 # still good after the refusals
    pools[c4].delete()
    with pytest.raises(ValueError, match="deleted"):
        engine.check_device_pools(pools)


def test_constructor_rejects_impossible_configurations():
    layout = layout_of("tiny_v4")
    with pytest.raises(ValueError, match="host_memory_limit_bytes = 64.00 GiB"):
        TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 2 << 20, "swa": 8})  # 89 GB of kv rows
    with pytest.raises(ValueError, match="host_memory_limit_bytes = 64.00 GiB"):   # None: the same default
        TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 2 << 20, "swa": 8},
                       config=TransferConfig(host_memory_limit_bytes=None))
    with pytest.raises(ValueError, match="kv: 16 pages x 42,496 B"):
        TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8},
                       config=TransferConfig(host_memory_limit_bytes=1 << 20))
    for bad in (0, 1.5, "64G", True):
        with pytest.raises(ValueError, match=f"'host_memory_limit_bytes' must be an integer >= 1, got {bad!r}"):
            TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8},
                           config=TransferConfig(host_memory_limit_bytes=bad))
    with pytest.raises(ValueError, match="max_staging_bytes"):
        TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8},
                       config=TransferConfig(max_staging_bytes=1000))
    with pytest.raises(ValueError, match="no entry for allocator 'swa'"):
        TransferEngine(layout, {"kv": 8}, {"kv": 16, "swa": 8})
    with pytest.raises(ValueError, match=r"device_pages\['kv'\] must be an integer >= 1, got 0"):
        TransferEngine(layout, {"kv": 0, "swa": 4}, {"kv": 16, "swa": 8})
    with pytest.raises(ValueError, match=r"host_pages\['swa'\] must be an integer >= 0, got -1"):
        TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": -1})
    with pytest.raises(ValueError, match="not allocators"):
        TransferEngine(layout, {"kv": 8, "swa": 4, "deepseek_v4_c4": 3}, {"kv": 16, "swa": 8})
    with pytest.raises(ValueError, match="kernels"):
        TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8}, config=TransferConfig(kernels="cuda"))
    for bad in (0, 1.0, "2"):
        with pytest.raises(ValueError, match="'landing_buckets' must be an integer >= 1"):
            TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8},
                           config=TransferConfig(landing_buckets=bad))


def test_a_plan_that_does_not_fit_moves_nothing(v4):
    layout, engine = v4
    pools = engine.init_device_pools()
    ones = {k: jnp.ones_like(v) for k, v in pools.items()}
    before_host = engine.read_host_rows("kv", np.arange(16))
    bad = [make_plan(layout, "load", {"kv": ([1, 8], [0, 1])}),           # device page out of range
           make_plan(layout, "backup", {"kv": ([1], [16])}),              # host page out of range
           make_plan(layout, "load", {"kv": ([1], [2])}, )]
    bad[2] = dataclasses.replace(bad[2], batches=(dataclasses.replace(bad[2].batches[0], pools=("swa",)),))
    for plan in bad:
        with pytest.raises(ValueError):
            engine.start(plan, ones)
        for k in ones:
            assert not ones[k].is_deleted()  # nothing was donated
    with pytest.raises(ValueError, match="lack"):
        engine.start(make_plan(layout, "load", {"kv": ([1], [2])}), {"swa": ones["swa"]})
    with pytest.raises(ValueError, match="takes a TransferPlan, got str"):
        engine.start("load everything", ones)
    assert np.array_equal(engine.read_host_rows("kv", np.arange(16)), before_host)


def test_handles_report_completion_bytes_and_time(v4):
    layout, engine = v4
    pools = engine.init_device_pools()
    empty = make_plan(layout, "backup", {})
    same, handle = engine.start(empty, pools)
    assert same is pools and handle.done() and handle.nbytes == 0 and handle.seconds is not None
    plan = make_plan(layout, "backup", {"kv": ([3, 1], [4, 5])})
    same, handle = engine.start(plan, pools)
    assert same is pools and handle.plan is plan and handle.nbytes == 2 * layout.page_bytes_of("kv")
    handle.wait()
    assert handle.done() and handle.seconds > 0
    load = make_plan(layout, "load", {"kv": ([6, 7], [4, 5])})
    new, handle = engine.start(load, pools)
    handle.wait()
    assert new is not pools and pools["deepseek_v4_c4"].is_deleted() and not pools["swa"].is_deleted()
    assert "done" in repr(handle)


def test_failed_transfers_raise_from_the_handle():
    from hicache_jax.transfer.handle import TransferHandle
    layout = layout_of("tiny_v4")
    handle = TransferHandle(make_plan(layout, "backup", {}), 0, 0.0, [], RuntimeError("device lost"))
    for call in (handle.done, handle.wait):
        with pytest.raises(RuntimeError, match="device lost"):
            call()


class _Token:
    """Stands in for a program's output: ready after `polls` calls of `is_ready`, or raising."""

    def __init__(self, polls, error=None):
        self.polls, self.error, self.calls, self.blocked = polls, error, 0, False

    def is_ready(self):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.calls > self.polls

    def block_until_ready(self):
        if self.error is not None:
            raise self.error
        self.blocked = True
        return self


def test_a_blocking_wait_polls_a_short_transfer_and_sleeps_on_a_long_one():
    from hicache_jax.transfer.handle import poll_until_ready
    soon = [_Token(3), _Token(0)]
    assert poll_until_ready(soon, 10.0) and soon[0].calls == 4
    never = _Token(10 ** 9)
    t = time.perf_counter()
    assert not poll_until_ready([never], 0.002)
    assert time.perf_counter() - t >= 0.002 and never.calls > 1
    assert poll_until_ready([], 0.0)


def test_an_error_seen_while_polling_is_the_transfers_error():
    from hicache_jax.transfer.handle import TransferHandle
    layout = layout_of("tiny_v4")
    handle = TransferHandle(make_plan(layout, "backup", {}), 0, 0.0, [_Token(2, RuntimeError("ECC error"))])
    for call in (handle.wait, handle.done, handle.wait):
        with pytest.raises(RuntimeError, match="ECC error"):
            call()
    slow = _Token(10 ** 9)     # never ready by polling: the wait goes on to block
    handle = TransferHandle(make_plan(layout, "backup", {}), 0, time.perf_counter(), [slow])
    assert not handle.done()
    handle.wait()
    assert slow.blocked and slow.calls > 2 and handle.seconds >= 0


def test_host_pages_read_and_write_whole_pages(v4):
    layout, engine = v4
    page = {s.name: np.full((s.num_layers, *s.page_shape), 7, np.uint8) for s in layout.moving_with("swa")}
    engine.write_host_page("swa", 3, page)
    got = engine.read_host_page("swa", 3)
    assert all(np.array_equal(got[k], v) for k, v in page.items())
    with pytest.raises(ValueError, match="outside"):
        engine.read_host_page("swa", 8)
    with pytest.raises(ValueError, match="no host pool"):
        engine.read_host_page("deepseek_v4_c4", 0)
    with pytest.raises(ValueError, match="exactly pools"):
        engine.write_host_page("swa", 0, {"swa": page["swa"]})


def test_warmup_compiles_programs_that_never_compute_on_host_memory(v4):
    layout, engine = v4
    early = TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8},
                           config=TransferConfig(early_copy_bytes=0))
    assert engine.warmup(max_pages=2) >= 8 and early.warmup(max_pages=2) > engine.warmup(max_pages=2)
    assert {"kv:copy[1]", "kv:copy[2]", "swa:copy[1]"} <= set(early.program_jaxprs())   # the early copies
    for e in (engine, early):
        for label, jaxpr in e.program_jaxprs().items():
            assert host_compute_violations(jaxpr) == [], label


def test_after_warmup_no_plan_compiles(v4):
    """A steady workload's first host hit must not pay a compile: after `warmup`, every
    plan up to the warmed size, backup and load, of any length and any host pages (so
    loads that gather pieces of several blocks, and of pages never written), uses programs
    compiled at warmup."""
    layout, engine = v4
    engine.warmup()
    warmed = set(engine.compiled_programs())
    pools = engine.init_device_pools()
    counter = hc.CompileCounter()           # compilations a caller waits for (not the background ones)
    rng = np.random.default_rng(0)
    for a, device, host in (("kv", 8, 16), ("swa", 4, 8)):
        for n in range(1, device + 1):
            for _ in range(4):
                for direction in ("backup", "load"):
                    pages = rng.permutation(host)[:n] if rng.random() < 0.5 else rng.integers(0, host - n) + np.arange(n)
                    plan = make_plan(layout, direction, {a: (rng.permutation(device)[:n], pages)})
                    pools, handle = engine.start(plan, pools)
                    handle.wait()
    engine.wait_compiles()                  # from here on, shapes seen above run their fused program
    # several allocators at once: a prefix's kv pages with its window's SWA page is one
    # program; more SWA pages than a window go allocator by allocator
    for n, swa in ((1, 1), (3, 1), (8, 1), (5, 3), (8, 4), (2, 2)):
        for direction in ("backup", "load"):
            host_kv = rng.integers(0, 16 - n) + np.arange(n) if rng.random() < 0.7 else rng.permutation(16)[:n]
            plan = make_plan(layout, direction, {"kv": (rng.permutation(8)[:n], host_kv),
                                                 "swa": (rng.permutation(4)[:swa], rng.permutation(8)[:swa])})
            pools, handle = engine.start(plan, pools)
            handle.wait()
    # a load of pieces may meanwhile have its fused program, compiled in the background
    assert {k for k in engine.compiled_programs() if "load_pieces" not in k} == warmed
    assert counter.count == 0, counter.names
    with pytest.raises(ValueError, match="max_pages >= 1, got 0"):
        engine.warmup(max_pages=0)


def test_warm_runs_run_every_warmed_program_once_and_leave_the_bytes(v4):
    """`warm_runs` after `warmup`: each program compiled (chunk programs and the plans of
    several allocators) runs once, on PAD pages, so the pools keep every byte; a host hit
    afterwards runs nothing for the first time. Misuse: pools that are not the engine's."""
    layout, _ = v4
    engine = TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8})
    engine.warmup(max_pages=4)
    rng = np.random.default_rng(3)
    pools = {name: jnp.asarray(rng.integers(-100, 100, p.shape).astype(p.dtype))
             for name, p in engine.init_device_pools().items()}
    before = {name: np.asarray(p) for name, p in pools.items()}
    ran = []
    engine.on_program_call(lambda label, program, *args: ran.append(label) or program(*args))
    pools = engine.warm_runs(pools)
    assert all(np.array_equal(np.asarray(pools[n]), before[n]) for n in before)
    assert len(ran) == len(set(ran)) and {"kv:pack[4]", "kv:load_block[4, 0]", "kv:h2d[4, 2]", "swa:unpack[2]"} <= set(ran)
    assert any(label.startswith("plan:load_block") for label in ran) and any(l.startswith("plan:pack") for l in ran)
    warmed = set(ran)
    for direction, device_pages in (("backup", [1, 2]), ("load", [6, 7])):   # a hit of two pages
        pools, handle = engine.start(make_plan(layout, direction, {"kv": (device_pages, [4, 5])}), pools)
        handle.wait()
    assert np.array_equal(np.asarray(pools["deepseek_v4_c4"])[:, 6:8], before["deepseek_v4_c4"][:, 1:3])
    assert set(ran) <= warmed, sorted(set(ran) - warmed)
    with pytest.raises(ValueError):
        engine.warm_runs({"kv": pools["swa"]})


def test_host_check_catches_compute_on_a_host_array():
    host = jax.device_put(np.zeros((4, 8), np.float32),
                          jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host"))
    bad = jax.jit(lambda h: h * 2).trace(host).jaxpr
    mixed = jax.jit(lambda h, x: jax.lax.dynamic_update_slice_in_dim(h, x, 0, 0)).trace
    good = jax.jit(lambda h, x: jax.lax.dynamic_update_slice_in_dim(h, jax.device_put(x, jax.memory.Space.Host), 1, 0))
    assert any("mul" in v for v in host_compute_violations(bad))
    assert host_compute_violations(good.trace(host, jnp.ones((1, 8))).jaxpr) == []
    with pytest.raises(Exception):
        mixed(host, jnp.ones((1, 8)))  # jax itself refuses a device update into a host array
    hlo = "%p = f32[4,8]{1,0:S(5)} parameter(0)\n%m = f32[4,8]{1,0:S(5)} multiply(%p, %p)"
    assert hlo_host_ops(hlo) == {"parameter", "multiply"}


def test_allocators_without_byte_pools_move_nothing():
    cfg = hc.load_model_config(CONFIGS / "tiny_v4.json")
    layout = hc.build_layout(dataclasses.replace(cfg, compress_ratios=(0,) * 5))  # SWA only: kv carries nothing
    assert not layout.moving_with("kv")
    engine = TransferEngine(layout, {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8})
    pools = engine.init_device_pools()
    assert sorted(pools) == ["swa"]
    plan = make_plan(layout, "backup", {"kv": ([1, 2], [3, 4]), "swa": ([0], [1])})
    _, handle = engine.start(plan, pools)
    handle.wait()


@pytest.mark.slow
def test_benchmark_smoke_mode_runs(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_transfer.py"), "--smoke", "--skip", "gqa,kernel_correctness",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads((tmp_path / "transfer.json").read_text())
    assert results["errors"] == {}
    assert all(row["exact"] for rows in results["sweeps"].values() for row in rows)
    assert results["one_page_all_pools"]["exact"] and (tmp_path / "transfer.png").exists()
