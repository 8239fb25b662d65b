"""TransferPlan: per-allocator page batches, derived rows, coalesced host runs, validation."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hicache_jax.plan import Direction, HostRun, make_plan, merge_plans
from helpers import layout


def test_plan_sorts_by_host_page_and_coalesces_runs():
    lay = layout("tiny_v4")
    plan = make_plan(lay, "backup", {"kv": ([7, 3, 9, 4, 12], [21, 20, 22, 23, 40]), "swa": ([5], [0])})
    kv = plan.batch("kv")
    assert kv.host_pages.tolist() == [20, 21, 22, 23, 40]
    assert kv.device_pages.tolist() == [3, 7, 9, 4, 12]           # moved with their host page
    assert kv.host_runs == (HostRun(0, 20, 4), HostRun(4, 40, 1))
    assert kv.pools == ("deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c128")
    assert plan.batch("swa").pools == ("swa", "deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state")
    assert plan.direction is Direction.BACKUP and not plan.is_empty
    dev, host = plan.pool_pages("deepseek_v4_c4_state")
    assert (dev.tolist(), host.tolist()) == ([5], [0])
    expect = 5 * (2 * 12_480 + 2 * 8_448 + 1 * 576) + 1 * (5 * 49_728 + 2 * 16_384 + 2 * 16_384)
    assert plan.nbytes(lay) == expect


def test_derived_rows():
    lay = layout("tiny_v4")
    # kv sidecars: row = slot // ratio, so anchor page 3 holds c4 rows 192..255 and c128 rows 6, 7
    slots = np.arange(3 * 256, 4 * 256)
    for pool, ratio in (("deepseek_v4_c4", 4), ("deepseek_v4_c128", 128)):
        rpp = lay.pool(pool).rows_per_page
        assert np.unique(slots // ratio).tolist() == list(range(3 * rpp, 4 * rpp))
    # swa state: the 8 ring rows of an SWA page
    assert lay.pool("deepseek_v4_c4_state").rows_per_page == 8


@pytest.mark.parametrize("pages,match", [
    ({"deepseek_v4_c4": ([0], [0])}, "no allocator"),
    ({"nope": ([0], [0])}, "not a pool"),
    ({"kv": ([0, 1], [0])}, "2 device pages but 1 host pages"),
    ({"kv": ([0, 0], [0, 1])}, "repeat"),
    ({"kv": ([0, 1], [3, 3])}, "repeat"),
    ({"kv": ([-1], [0])}, "out of range"),
    ({"kv": ([0.5], [0])}, "integers"),
])
def test_plan_validation(pages, match):
    with pytest.raises(ValueError, match=match):
        make_plan(layout("tiny_v4"), "load", pages)


def test_plan_capacity_and_empty():
    lay = layout("tiny_gqa")
    with pytest.raises(ValueError, match=r"kv host pages \[16\] outside 0..15"):
        make_plan(lay, "load", {"kv": ([0], [16])}, host_capacity={"kv": 16})
    empty = make_plan(lay, "load", {"kv": ([], [])})
    assert empty.is_empty and empty.nbytes(lay) == 0
    assert make_plan(lay, "backup", {"kv": ([1], [2])}).batch("kv").pools == ("gqa_kv",)


def test_merge_plans_sorts_the_union_by_host_page():
    lay = layout("tiny_v4")
    a = make_plan(lay, "load", {"kv": ([7, 3], [20, 21]), "swa": ([5], [9])})
    b = make_plan(lay, "load", {"kv": ([9, 4], [22, 40])})
    merged = merge_plans([a, b])
    kv = merged.batch("kv")
    assert kv.device_pages.tolist() == [7, 3, 9, 4] and kv.host_pages.tolist() == [20, 21, 22, 40]
    assert kv.host_runs == (HostRun(0, 20, 3), HostRun(3, 40, 1))
    assert [x.allocator for x in merged.batches] == ["kv", "swa"]
    assert merged.batch("swa").device_pages.tolist() == [5] and merged.direction is Direction.LOAD
    assert merged.nbytes(lay) == a.nbytes(lay) + b.nbytes(lay)
    assert merge_plans([a]) is a


@pytest.mark.parametrize("which,match", [
    ("none", "at least one"), ("directions", "one direction"), ("device", "device pages \\[3\\]"),
    ("host", "host pages \\[21\\]"),
])
def test_merge_plans_refuses(which, match):
    lay = layout("tiny_v4")
    a = make_plan(lay, "load", {"kv": ([7, 3], [20, 21])})
    other = {"none": None, "directions": make_plan(lay, "backup", {"kv": ([1], [1])}),
             "device": make_plan(lay, "load", {"kv": ([3], [30])}),
             "host": make_plan(lay, "load", {"kv": ([8], [21])})}[which]
    with pytest.raises(ValueError, match=match):
        merge_plans([] if other is None else [a, other])


@st.composite
def _disjoint_plans(draw):
    """Load plans of tiny_v4 over disjoint device and host pages of each allocator."""
    n = draw(st.integers(1, 5))
    plans = []
    for allocator, cap in (("kv", 64), ("swa", 32)):
        dev = draw(st.permutations(range(cap)))
        host = draw(st.permutations(range(cap)))
        sizes = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
        lo = 0
        for i, k in enumerate(sizes):
            if len(plans) <= i:
                plans.append({})
            if k or allocator == "kv":
                plans[i][allocator] = (dev[lo:lo + k], host[lo:lo + k])
            lo += k
    return [make_plan(layout("tiny_v4"), "load", p) for p in plans]


@settings(max_examples=60, deadline=None)
@given(_disjoint_plans())
def test_merge_plans_is_make_plan_of_the_union(plans):
    lay = layout("tiny_v4")
    merged = merge_plans(plans)
    union = {}
    for p in plans:
        for b in p.batches:
            d, h = union.setdefault(b.allocator, ([], []))
            d.extend(b.device_pages.tolist())
            h.extend(b.host_pages.tolist())
    expect = make_plan(lay, "load", union)
    assert [b.allocator for b in merged.batches] == [b.allocator for b in expect.batches]
    for got, want in zip(merged.batches, expect.batches):
        assert got.pools == want.pools and got.host_runs == want.host_runs
        assert got.host_pages.tolist() == want.host_pages.tolist()
        assert got.device_pages.tolist() == want.device_pages.tolist()
        assert got.device_pages.dtype == np.int32 and got.host_pages.dtype == np.int32
    assert merged.nbytes(lay) == sum(p.nbytes(lay) for p in plans)
