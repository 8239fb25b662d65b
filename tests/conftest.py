import os
import pathlib

import pytest

# Four virtual CPU devices, so mesh (TP) tests run on CPU. Must be set before jax starts;
# control-plane tests never import jax at all.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


@pytest.fixture
def config_path():
    return lambda name: CONFIGS / f"{name}.json"
