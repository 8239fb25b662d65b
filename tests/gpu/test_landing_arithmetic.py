"""A step that lands a deferred load must compute what the same step computes on pools the
load filled before it, bit for bit: the landing only moves bytes.

- Landing nothing (the warm-up examples: every device page PAD): any difference in the
  logits is the compiled program's own arithmetic, not data.
- Landing real bytes (two pages of history the model wrote, backed up, scrambled on the
  device, then loaded back): against a blocking load of the same plan and against the
  history itself. A failure names the pools whose bytes differ after the step, so it says
  whether the step read other bytes or computed other arithmetic on the same bytes.

The models' steps are compiled with `hc.step_compiler_options()`. Without them, on the H200
(2026-12-05, jax 0.11.2) both tests failed for most cases, groups 1 included: XLA's Triton
GEMM fusions rounded the step with a landing differently; with Triton GEMMs off (and only
that flag) every case passed. Runs everywhere; on a GPU it is part of `pytest -m gpu`, and
`.ci/gpu landing` runs it under several XLA flag sets.
"""
import pathlib
import sys

import jax
import numpy as np
import pytest

import hicache_jax as hc
from conftest import CONFIGS
from examples.tiny_models import make_model
from hicache_jax.plan import make_plan

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "transfer"))
from test_landing import as_bytes, engine_for  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
CASES = [("tiny_v4", 1), ("tiny_v4", 2), ("tiny_v41", 4), ("tiny_gqa", 2)]


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def chunks(layout, model):
    """Three pages of prompt and the page table of a model with 8 pages."""
    tokens = np.random.default_rng(0).integers(1, model.vocab_size, 3 * layout.page_size).astype(np.int32)
    return tokens, np.arange(8, dtype=np.int32)


@pytest.mark.parametrize("name, groups", CASES)
def test_a_step_that_lands_nothing_computes_the_same_bits(name, groups):
    layout = hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))
    cache = hc.HiCache(layout, hc.HiCacheConfig(device_pages=8, host_pages=16,
                                                transfer=hc.TransferConfig(layer_groups=groups, landing_buckets=4)))
    model = make_model(layout, seed=7, max_pages=8)
    tokens, table = chunks(layout, model)
    P = layout.page_size
    pools = cache.device_pools
    for q in range(2):                   # two pages of history, written by the model itself
        pools, _ = model.forward_chunk(pools, table, table, tokens[q * P:(q + 1) * P], q * P, P)
    history = {k: np.asarray(v) for k, v in pools.items()}
    put = lambda: {k: jax.device_put(v, pools[k].sharding) for k, v in history.items()}

    def third_chunk(landing):
        out, logits = model.forward_chunk(put(), table, table, tokens[2 * P:], 2 * P, P - 3, landing=landing)
        return np.asarray(logits), as_bytes(out)

    want_logits, want_pools = third_chunk(None)
    examples = list(cache.landing_examples())
    assert examples
    for landing in examples:
        logits, pools_after = third_chunk(landing)
        assert same_bits(logits, want_logits), \
            f"{name}, {groups} groups, a {landing.blocks[0][0].shape[0]}-page landing changed the logits"
        assert all(np.array_equal(pools_after[k], want_pools[k]) for k in want_pools)


@pytest.mark.parametrize("name, groups", CASES)
def test_a_step_that_lands_real_bytes_computes_what_a_blocking_load_gives(name, groups):
    layout, allocators, engine = engine_for(name, groups, kernels="auto")
    model = make_model(layout, seed=7, max_pages=8)
    tokens, table = chunks(layout, model)
    P = layout.page_size
    pools = engine.init_device_pools()
    for q in range(2):
        pools, _ = model.forward_chunk(pools, table, table, tokens[q * P:(q + 1) * P], q * P, P)
    history = as_bytes(pools)
    _, h = engine.start(make_plan(layout, "backup", {a: ([0, 1], [0, 1]) for a in allocators}), pools)
    h.wait()

    def on_device(arrays):
        return {k: jax.device_put(v.view(pools[k].dtype), pools[k].sharding) for k, v in arrays.items()}

    def scrambled():                     # the history with its two pages overwritten
        out = {k: v.copy() for k, v in history.items()}
        rng = np.random.default_rng(1)
        for v in out.values():
            v[:, :2] = rng.integers(0, 256, v[:, :2].shape, np.uint8)
        return on_device(out)

    def third_chunk(pools, landing=None):
        out, logits = model.forward_chunk(pools, table, table, tokens[2 * P:], 2 * P, P - 3, landing=landing)
        return np.asarray(logits), out

    load = make_plan(layout, "load", {a: ([0, 1], [0, 1]) for a in allocators})
    blocking, h = engine.start(load, scrambled())
    h.wait()
    assert all(np.array_equal(v, history[k]) for k, v in as_bytes(blocking).items())
    want_logits, want_pools = third_chunk(on_device(history))
    blocking_logits, _ = third_chunk(blocking)
    assert same_bits(blocking_logits, want_logits), f"{name}: a blocking load changed the next chunk's logits"

    deferred, h = engine.start(load, scrambled(), deferred=True)
    assert h.landing is not None and [b[0].shape[0] for b in h.landing.blocks] == [2]
    logits, landed = third_chunk(deferred, h.landing)
    h.landed(landed[next(iter(landed))])
    h.wait()
    want_after, got_after = as_bytes(want_pools), as_bytes(landed)
    differ = sorted(k for k in want_after if not np.array_equal(got_after[k], want_after[k]))
    assert same_bits(logits, want_logits), \
        f"{name}, {groups} groups: the landed step's logits differ (max |d| " \
        f"{float(np.max(np.abs(logits - want_logits))):.3g}); pools differing after the step: {differ or 'none'}"
    assert not differ, f"{name}, {groups} groups: pools differ after the landed step: {differ}"
