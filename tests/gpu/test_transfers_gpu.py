"""On an NVIDIA GPU, with the Mosaic GPU kernels: backup and load-back are bit-exact on every
pool, whole-block and fragmented, grouped or not; a step lands a deferred load with the same
bytes as a blocking one (`pytest -m gpu`; skipped elsewhere)."""
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "transfer"))
from test_landing import as_bytes, engine_for, random_pools, step_fn  # noqa: E402
from test_round_trip import test_round_trip_is_exact_and_touches_nothing_else as round_trip  # noqa: E402

from hicache_jax.layout import groups as layer_groups  # noqa: E402
from hicache_jax.plan import make_plan  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("case", [("tiny_v4", None, "auto"), ("tiny_v4", None, "auto", 3),
                                  ("tiny_v41", None, "auto", 2), ("tiny_gqa", None, "auto", 2)],
                         ids=lambda c: "-".join(map(str, c)))
def test_round_trip_on_the_gpu_kernels(case):
    round_trip(case)


@pytest.mark.parametrize("name, groups", [("tiny_v4", 2), ("tiny_v41", 4), ("tiny_gqa", 2)])
def test_a_step_lands_like_a_blocking_load_on_the_gpu(name, groups):
    layout, allocators, engine = engine_for(name, groups, kernels="auto")
    assert engine.kernels == "mosaic_gpu"
    pools = random_pools(engine, 0)
    for a in allocators:
        _, h = engine.start(make_plan(layout, "backup", {a: (np.arange(8), np.arange(8))}), pools)
        h.wait()
    load = {a: (np.arange(8)[::-1], np.arange(8)) for a in allocators}
    blocking, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1))
    h.wait()
    deferred, h = engine.start(make_plan(layout, "load", load), random_pools(engine, 1), deferred=True)
    assert h.landing is not None
    landed, _ = step_fn(layer_groups.num_model_layers(layout), 1)(deferred, jnp.zeros(()), h.landing)
    h.landed(landed[next(iter(landed))])
    h.wait()
    want, got = as_bytes(blocking), as_bytes(landed)
    assert all(np.array_equal(got[k], want[k]) for k in want)
