"""The engine's pack / unpack programs built on the Mosaic GPU and Pallas TPU kernels,
interpreted on the CPU, equal the same programs on the jnp reference, in place (donated):
on one device, and for TPU under `shard_map` on a tp = 2 mesh (GQA rows split over ranks).

The other transfer programs cannot be compiled around these interpreters on the CPU:
both interpreters use ordered effects, and jit loses count of its outputs' memory kinds
when a program with host-memory outputs has ordered effects (jax 0.11.2 and 0.12). The
host copies themselves do not depend on the kernels (test_round_trip.py runs them).
The Mosaic GPU interpreter also cannot run one kernel per CPU device under `shard_map`
(it keeps one state for all devices), so its tp case runs only on the GPU.
"""
import numpy as np
import pytest

import jax

import hicache_jax as hc
import pallas_kernels as pk
from hicache_jax.pools import DevicePools, Devices, RowFormat
from hicache_jax.transfer.programs import AllocatorPrograms

from conftest import CONFIGS, tp_mesh

DEVICE_PAGES, ROWS = 12, 4


def programs(layout, allocator, devices, kernels, groups=1):
    fmt = RowFormat.create(layout, allocator, devices.tp, groups)
    pools = DevicePools(layout, {a.name: DEVICE_PAGES for a in layout.allocator_pools}, devices)
    no_host = lambda rows: pytest.fail("pack / unpack never touch the host tier")
    host = devices.row_sharding(fmt.sharded, "pinned_host")
    return AllocatorPrograms(fmt, [pools.shape(s) for s in fmt.pools], devices, no_host, host, ROWS, kernels, None), pools


@pytest.mark.parametrize("kernels, name, tp, groups", [
    ("mosaic_gpu_interpret", "tiny_v4", None, 1), ("tpu_interpret", "tiny_v4", None, 1), ("tpu_interpret", "tiny_gqa", 2, 1),
    ("mosaic_gpu_interpret", "tiny_v41", None, 3), ("tpu_interpret", "tiny_gqa", 2, 2)])
def test_pack_and_unpack_programs_equal_reference(kernels, name, tp, groups):
    """Rows are one part per layer group (`groups`), each packed and unpacked by its own
    kernel call over a range of each pool's layers."""
    layout = hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))
    mesh = tp_mesh(tp) if tp else None
    devices = Devices.create(mesh)
    rng = np.random.default_rng(tp or 0)
    allocator = "kv"
    ref, pools_of = programs(layout, allocator, devices, "reference", groups)
    got, _ = programs(layout, allocator, devices, kernels, groups)
    assert (len(ref.fmt.parts) > 1) == (groups > 1)
    specs = ref.fmt.pools
    pools = tuple(jax.device_put(_random(rng, pools_of.shape(s), s.dtype), pools_of.sharding(s)) for s in specs)
    idx = rng.permutation(DEVICE_PAGES)[:ROWS].astype(np.int32)
    idx[1] = pk.PAD
    want = ref.compiled("pack", ROWS)(pools, idx)
    rows = got.compiled("pack", ROWS)(pools, idx)
    assert len(rows) == len(want) == len(ref.fmt.parts)
    assert all(np.array_equal(_bytes(r), _bytes(w)) for r, w in zip(rows, want))
    new_rows = tuple(jax.device_put(_random(rng, w.shape, w.dtype), ref.staging_sharding) for w in want)
    want_pools, _ = ref.compiled("unpack", ROWS)(tuple(p + 0 for p in pools), new_rows, idx)
    got_pools, _ = got.compiled("unpack", ROWS)(tuple(p + 0 for p in pools), new_rows, idx)
    for s, a, b in zip(specs, got_pools, want_pools):
        assert np.array_equal(_bytes(a), _bytes(b)), s.name


def _random(rng, shape, dtype):
    """Random bits of any dtype (NaN patterns included: comparisons are on bytes)."""
    size = np.dtype(dtype).itemsize
    return rng.integers(0, 256, (*shape[:-1], shape[-1] * size), np.uint8).view(dtype)


def _bytes(x):
    return np.ascontiguousarray(np.asarray(x)).view(np.uint8)
