"""Where pool arrays live: one-device shardings are made and recognised on every supported
jax without its deprecation of the one-device sharding class (jax 0.12.1)."""
import warnings

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hicache_jax.pools.placement import HOST_MEMORY, Devices, is_single_device, single_device


def test_one_device_shardings_are_made_and_recognised_without_a_warning():
    device = jax.devices()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        host, plain = single_device(device, HOST_MEMORY), single_device(device)
        assert is_single_device(host) and is_single_device(plain)
        assert host.memory_kind == HOST_MEMORY and plain.device_set == {device}
        mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
        assert not is_single_device(NamedSharding(mesh, PartitionSpec()))     # a mesh, even of one device
        devices = Devices.create(None)
        assert is_single_device(devices.replicated()) and is_single_device(devices.row_sharding(False, HOST_MEMORY))
        x = jax.device_put(np.arange(4, dtype=np.int32), host)
        assert x.sharding.memory_kind == HOST_MEMORY and np.asarray(x).tolist() == [0, 1, 2, 3]
