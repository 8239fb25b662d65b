"""A plan that does not fit the engine raises ValueError before anything moves."""
import dataclasses

import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.plan import HostRun, make_plan
from hicache_jax.transfer.plan_check import check_plan

from conftest import CONFIGS


@pytest.fixture(scope="module")
def layout():
    return hc.build_layout(hc.load_model_config(CONFIGS / "tiny_v4.json"))


DEV, HOST = {"kv": 8, "swa": 4}, {"kv": 16, "swa": 8}


def corrupt(plan, which, **changes):
    batches = tuple(dataclasses.replace(b, **changes) if b.allocator == which else b for b in plan.batches)
    return dataclasses.replace(plan, batches=batches)


def test_good_plans_pass(layout):
    plan = make_plan(layout, "backup", {"kv": ([7, 0, 3], [4, 5, 9]), "swa": ([1], [7])})
    check_plan(plan, layout, DEV, HOST)
    check_plan(make_plan(layout, "load", {}), layout, DEV, HOST)


@pytest.mark.parametrize("change, message", [
    (dict(device_pages=np.array([7, 0, 8])), "outside 0..7"),
    (dict(device_pages=np.array([7, 7, 3])), "repeat"),
    (dict(host_pages=np.array([4, 5, 16])), "outside 0..15"),
    (dict(device_pages=np.array([7, 0])), "2 device pages but 3 host pages"),
    (dict(device_pages=np.array([0.5, 1, 2])), "integer"),
    (dict(pools=("deepseek_v4_c4",)), "moves pools"),
    (dict(host_runs=(HostRun(0, 4, 3),)), "host runs say"),
    (dict(host_runs=(HostRun(0, 4, 2),)), "do not tile"),
    (dict(host_runs=(HostRun(1, 5, 1), HostRun(0, 4, 1), HostRun(2, 9, 1))), "do not tile"),
])
def test_bad_batches_are_named(layout, change, message):
    plan = corrupt(make_plan(layout, "backup", {"kv": ([7, 0, 3], [4, 5, 9])}), "kv", **change)
    with pytest.raises(ValueError, match=message):
        check_plan(plan, layout, DEV, HOST)


def test_bad_plans_are_named(layout):
    plan = make_plan(layout, "backup", {"kv": ([1], [2])})
    with pytest.raises(ValueError, match="TransferPlan"):
        check_plan("plan", layout, DEV, HOST)
    with pytest.raises(ValueError, match="two batches"):
        check_plan(dataclasses.replace(plan, batches=plan.batches * 2), layout, DEV, HOST)
    with pytest.raises(ValueError, match="not an allocator"):
        check_plan(corrupt(plan, "kv", allocator="deepseek_v4_c4"), layout, DEV, HOST)
    with pytest.raises(ValueError, match="not an allocator"):
        check_plan(corrupt(plan, "kv", allocator="no_such_pool"), layout, DEV, HOST)
    with pytest.raises(ValueError, match=r"must be a name \(str\), got \['kv'\]"):
        check_plan(corrupt(plan, "kv", allocator=["kv"]), layout, DEV, HOST)
    with pytest.raises(ValueError, match="Direction"):
        check_plan(dataclasses.replace(plan, direction="sideways"), layout, DEV, HOST)
