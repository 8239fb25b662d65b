import os
import pathlib
import sys

import pytest
from hypothesis import settings

# Bounded in CI; `HICACHE_HYPOTHESIS=long` runs ~10^5 stateful steps per machine locally.
settings.register_profile("ci", max_examples=40, deadline=None)
settings.register_profile("long", max_examples=2500, deadline=None)
settings.load_profile(os.environ.get("HICACHE_HYPOTHESIS", "ci"))

# Four virtual CPU devices, so mesh (TP) tests run on CPU, also beside a single GPU (see
# `mesh_devices`). Must be set before jax starts; control-plane tests never import jax at all.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=4".strip()

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
if str(ROOT) not in sys.path:      # the examples (tiny models, decode loop) are imported by tests
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def config_path():
    return lambda name: CONFIGS / f"{name}.json"


def mesh_devices(n: int) -> list:
    """`n` devices of one platform for a mesh: the default backend's when it has that many,
    else the CPU's (four virtual ones, above), so tests of several devices run unchanged on a
    machine with one GPU; the test is skipped where neither has `n`."""
    import jax
    for devices in (jax.devices(), jax.devices("cpu")):
        if len(devices) >= n:
            return list(devices[:n])
    pytest.skip(f"needs {n} devices of one platform: this machine has {len(jax.devices())} "
                f"{jax.default_backend()} and {len(jax.devices('cpu'))} CPU devices")


def tp_mesh(n: int, axis: str = "tp"):
    """A one-axis mesh of `n` devices (see `mesh_devices`)."""
    import jax
    return jax.make_mesh((n,), (axis,), devices=mesh_devices(n))


def other_device(array):
    """A device that does not hold `array`: another of its platform's, else the CPU's."""
    import jax
    held = array.devices()
    platform = next(iter(held)).platform
    for device in (*jax.devices(platform), *jax.devices("cpu")):
        if device not in held:
            return device
    pytest.skip("needs a second device")
