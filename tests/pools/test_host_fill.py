"""The host tier starts all zero, in pinned host memory, whichever fill built it.

Runs on one device and on a CPU mesh (tp=2: GQA pools sharded, V4 pools replicated), and
checks that the compiled fill computes nothing on host memory.
"""
import jax
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.pools import HOST_MEMORY, Devices, HostFill, HostTier
from hicache_jax.pools import host_fill
from hicache_jax.transfer import host_compute_violations

from conftest import CONFIGS

LIMIT = 1 << 30


def tier(name, tp, fill, pages=24):
    layout = hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))
    mesh = jax.make_mesh((tp,), ("tp",), devices=jax.devices()[:tp]) if tp else None
    allocators = [p.name for p in layout.allocator_pools if layout.moving_with(p.name)]
    return HostTier(layout, {a: pages for a in allocators}, Devices.create(mesh), LIMIT, fill)


@pytest.mark.parametrize("name,tp", [("tiny_v4", None), ("tiny_gqa", None), ("tiny_gqa", 2), ("tiny_v4", 2)])
@pytest.mark.parametrize("fill", list(HostFill))
def test_buffers_are_zero_pinned_and_placed(name, tp, fill):
    host = tier(name, tp, fill)
    assert host.buffers and set(host.fills) == set(host.buffers)
    for a, buf in host.buffers.items():
        assert host.fills[a] is fill   # on CPU the compiled fill never falls back
        assert buf.shape == host.shape(a) and buf.dtype == np.dtype(host.formats[a].dtype)
        assert buf.sharding == host.sharding(a) and buf.sharding.memory_kind == HOST_MEMORY
        for shard in buf.addressable_shards:
            assert shard.data.sharding.memory_kind == HOST_MEMORY
            assert not np.asarray(shard.data).view(np.uint8).any(), (a, shard.device)


def test_the_compiled_fill_moves_rows_to_host_and_computes_nothing_there():
    device = jax.devices()[0]
    traced = host_fill.traced_fill(5, 384, "bfloat16", device)
    assert host_compute_violations(traced.jaxpr) == []
    out, used = host_fill.zeros_on_host((5, 384), np.dtype("float32"), device, HostFill.COMPILED)
    assert used is HostFill.COMPILED and out.shape == (5, 384) and out.sharding.memory_kind == HOST_MEMORY
    assert not np.asarray(out).any()


def test_the_compiled_fill_falls_back_to_numpy_when_it_needs_device_memory(monkeypatch):
    monkeypatch.setattr(host_fill, "MAX_FILL_DEVICE_TEMP_BYTES", -1)
    host_fill.fill_program.cache_clear()
    try:
        out, used = host_fill.zeros_on_host((3, 128), np.dtype("float32"), jax.devices()[0], HostFill.COMPILED)
    finally:
        host_fill.fill_program.cache_clear()
    assert used is HostFill.NUMPY and out.sharding.memory_kind == HOST_MEMORY and not np.asarray(out).any()


def test_an_unknown_fill_is_refused():
    with pytest.raises(ValueError, match="host_fill"):
        tier("tiny_v4", None, "mmap")
