"""The other ways of reading host rows (`TransferConfig.host_reads`, `host_block_pages`),
which the GPU measures against the default: each moves exactly the bytes the default moves
and touches nothing outside the plan (`Harness.run` checks every page of both tiers).

    host_reads="put"        a load's whole host blocks reach the device by one `device_put`
                            before its programs, which unpack the copies
    host_block_pages=G      a backup run becomes host blocks of at most G pages, so a hit on
                            part of a run reads whole blocks except at its ends
"""
import jax.numpy as jnp
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.layout import groups as layer_groups
from hicache_jax.plan import make_plan
from hicache_jax.pools.host_tier import block_rows
from hicache_jax.transfer import host_compute_violations

from conftest import CONFIGS
from test_fused_loads import record
from test_landing import as_bytes, random_pools, step_fn
from test_round_trip import DEVICE_PAGES, HOST_PAGES, Harness

VARIANTS = [{"host_reads": "put"}, {"host_block_pages": 2}, {"host_reads": "put", "host_block_pages": 2}]


def variant_id(v):
    return "-".join(f"{k}={v}" for k, v in v.items())


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("case", [("tiny_v4", None, "reference"), ("tiny_v41", None, "reference", 2),
                                  ("tiny_gqa", 2, "reference")], ids=lambda c: "-".join(map(str, c)))
def test_random_backups_and_loads_of_parts_of_them_are_exact(case, variant):
    t = Harness(*case, **variant)
    rng = np.random.default_rng(7)
    for i in range(8):
        pages = {}
        for a in t.allocators:
            n = int(rng.integers(1, 9))
            dev = rng.permutation(DEVICE_PAGES)[:n]
            if i % 3 == 2:                     # fragmented host pages
                host = rng.permutation(HOST_PAGES)[:n]
            else:                              # one run (a power of two every third time)
                n = 1 << (n.bit_length() - 1) if i % 3 == 0 else n
                start = int(rng.integers(0, HOST_PAGES - n))
                host, dev = np.arange(start, start + n), dev[:n]
            pages[a] = (dev, host)
        t.run("backup" if i % 2 == 0 else "load", pages)
        t.run("load", {a: (d[1:], h[1:]) for a, (d, h) in pages.items() if len(d) > 1})   # part of it
    if "host_block_pages" in variant:
        for table in t.engine.host.tables.values():
            assert all(block_rows(b) <= variant["host_block_pages"] for b in table.arrays.values())
    assert all(not host_compute_violations(j) for j in t.engine.program_jaxprs().values())


def test_blocks_of_two_pages_make_a_hit_inside_a_run_whole_blocks_that_are_put():
    t = Harness("tiny_v4", None, "reference", host_reads="put", host_block_pages=2)
    t.run("backup", {"kv": (np.arange(8), np.arange(8, 16)), "swa": ([0], [3])})
    table = t.engine.host.tables["kv"]
    assert [(row, n, block_rows(table.arrays[b])) for b, row, n in table.segments(8, 8)] == [(0, 2, 2)] * 4
    calls = record(t)
    t.run("load", {"kv": ([11, 10, 9, 8], [10, 11, 12, 13]), "swa": ([5], [3])})   # blocks 10-11 and 12-13 whole
    assert [c for c in calls if c.startswith("put")] == ["put[3]"], calls         # two kv blocks, one SWA
    assert not [c for c in calls if ":h2d[" in c or ":load_block[" in c and c.endswith(", 0]")], calls
    calls.clear()
    t.run("load", {"kv": ([1, 2, 3], [9, 10, 11]), "swa": ([4], [3])})   # page 9 is half a block: sliced
    assert [c for c in calls if ":h2d[" in c] == ["kv:h2d[2, 0]"] and "put[2]" in calls, calls


def test_without_a_cap_a_backup_run_is_one_block_and_a_hit_inside_it_is_sliced():
    t = Harness("tiny_v4", None, "reference", host_reads="put")
    t.run("backup", {"kv": (np.arange(8), np.arange(8, 16)), "swa": ([0], [3])})
    table = t.engine.host.tables["kv"]
    assert [(row, n, block_rows(table.arrays[b])) for b, row, n in table.segments(8, 8)] == [(0, 8, 8)]
    calls = record(t)
    t.run("load", {"kv": ([11, 10, 9, 8], [10, 11, 12, 13]), "swa": ([5], [3])})
    assert "put[1]" in calls and [c for c in calls if ":h2d[" in c] == ["kv:h2d[8, 2]"], calls


def test_a_put_holds_at_most_a_chunk_of_each_allocator_on_the_device():
    """A load larger than a chunk puts only a chunk's rows of each allocator; its other
    whole blocks move inside their programs, as by default."""
    t = Harness("tiny_v4", None, "reference", host_reads="put")
    assert t.engine.chunk_pages("kv") == 8
    t.run("backup", {"kv": (np.arange(8), np.arange(0, 8))})
    t.run("backup", {"kv": (np.arange(8, 12), np.arange(8, 12))})
    calls = record(t)
    t.run("load", {"kv": (np.arange(12)[::-1], np.arange(12))})          # blocks of 8 and 4 rows
    assert "put[1]" in calls and "kv:load_block[8, 1]" in calls and "kv:load_block[4, 0]" in calls, calls


def test_a_cap_bounds_the_blocks_a_deferred_load_leaves_to_a_step():
    layout = hc.build_layout(hc.load_model_config(CONFIGS / "tiny_v4.json"))
    engine = hc.TransferEngine(layout, {"kv": 8, "swa": 8}, {"kv": 16, "swa": 16},
                               config=hc.TransferConfig(kernels="reference", layer_groups=2, host_block_pages=2))
    assert engine.landing_sizes == (1, 2)
    pools = random_pools(engine, 0)
    _, h = engine.start(make_plan(layout, "backup", {"kv": (np.arange(4), np.arange(4, 8)), "swa": ([1], [2])}), pools)
    h.wait()
    load = {"kv": ([7, 2, 5, 1], np.arange(4, 8)), "swa": ([3], [2])}
    blocking, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1))
    h.wait()
    deferred, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1), deferred=True)
    assert [block[0].shape[0] for block in h.landing.blocks] == [2]
    landed, _ = step_fn(layer_groups.num_model_layers(layout), 1)(deferred, jnp.zeros(()), h.landing)
    h.landed(landed[next(iter(landed))])
    h.wait()
    want, got = as_bytes(blocking), as_bytes(landed)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_warmup_compiles_what_a_put_load_runs():
    t = Harness("tiny_v4", None, "reference", fuse_after=0, host_reads="put", host_block_pages=2)
    t.engine.warmup()
    compiled = set(t.engine.compiled_programs())
    t.run("backup", {"kv": (np.arange(8), np.arange(8, 16)), "swa": ([0], [3])})
    t.run("load", {"kv": ([11, 10, 9, 8, 7], [9, 10, 11, 12, 13]), "swa": ([5], [3])})
    t.run("load", {"kv": ([1, 2], [8, 9]), "swa": ([4], [3])})
    assert set(t.engine.compiled_programs()) - compiled <= {label for label in t.engine.compiled_programs()
                                                           if ":read[" in label}


@pytest.mark.parametrize("field, value, says", [
    ("host_reads", "dma", "host_reads"), ("host_reads", 1, "host_reads"),
    ("host_block_pages", 3, "power of two"), ("host_block_pages", 0, "host_block_pages"),
    ("host_block_pages", 2.0, "host_block_pages")])
def test_bad_read_settings_are_refused_by_name(field, value, says):
    with pytest.raises(ValueError, match=says):
        hc.TransferConfig(**{field: value})
    assert hc.TransferConfig(host_reads="put").host_reads is hc.HostReads.PUT
