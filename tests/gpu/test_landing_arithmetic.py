"""A step that lands a deferred load must compute what the same step with no landing computes,
bit for bit: the landing only moves bytes. Here the landing lands nothing (the warm-up
examples: every device page PAD), so any difference in the logits is the compiled
program's own arithmetic, not data. Runs everywhere; on a GPU it is part of `pytest -m gpu`.
"""
import jax
import numpy as np
import pytest

import hicache_jax as hc
from conftest import CONFIGS
from examples.tiny_models import make_model

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.parametrize("name, groups", [("tiny_v4", 1), ("tiny_v4", 2), ("tiny_v41", 4), ("tiny_gqa", 2)])
def test_a_step_that_lands_nothing_computes_the_same_bits(name, groups):
    layout = hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))
    cache = hc.HiCache(layout, hc.HiCacheConfig(device_pages=8, host_pages=16,
                                                transfer=hc.TransferConfig(layer_groups=groups, landing_buckets=4)))
    model = make_model(layout, seed=7, max_pages=8)
    rng = np.random.default_rng(0)
    P = layout.page_size
    tokens = rng.integers(1, model.vocab_size, 3 * P).astype(np.int32)
    table = np.arange(8, dtype=np.int32)
    pools = cache.device_pools
    for q in range(2):                   # two pages of history, written by the model itself
        pools, _ = model.forward_chunk(pools, table, table, tokens[q * P:(q + 1) * P], q * P, P)
    history = {k: np.asarray(v) for k, v in pools.items()}
    put = lambda: {k: jax.device_put(v, pools[k].sharding) for k, v in history.items()}

    def third_chunk(landing):
        out, logits = model.forward_chunk(put(), table, table, tokens[2 * P:], 2 * P, P - 3, landing=landing)
        return np.asarray(logits), {k: np.asarray(v) for k, v in out.items()}

    want_logits, want_pools = third_chunk(None)
    examples = list(cache.landing_examples())
    assert examples
    for landing in examples:
        logits, pools_after = third_chunk(landing)
        assert np.array_equal(logits.view(np.uint32), want_logits.view(np.uint32)), \
            f"{name}, {groups} groups, a {landing.blocks[0][0].shape[0]}-page landing changed the logits"
        assert all(np.array_equal(pools_after[k].view(np.uint8), want_pools[k].view(np.uint8)) for k in want_pools)
