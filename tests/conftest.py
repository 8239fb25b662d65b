import os
import pathlib
import sys

import pytest
from hypothesis import settings

# Bounded in CI; `HICACHE_HYPOTHESIS=long` runs ~10^5 stateful steps per machine locally.
settings.register_profile("ci", max_examples=40, deadline=None)
settings.register_profile("long", max_examples=2500, deadline=None)
settings.load_profile(os.environ.get("HICACHE_HYPOTHESIS", "ci"))

# Four virtual CPU devices, so mesh (TP) tests run on CPU. Must be set before jax starts;
# control-plane tests never import jax at all.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
if str(ROOT) not in sys.path:      # the examples (tiny models, decode loop) are imported by tests
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def config_path():
    return lambda name: CONFIGS / f"{name}.json"
