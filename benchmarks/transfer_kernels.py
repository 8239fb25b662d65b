"""Kernel section of the transfer benchmark: the Pallas kernels against their references on
the device (speed: bench_kernels.py)."""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

import pallas_kernels as pk
from transfer_common import Bench


def kernel_correctness(bench: Bench):
    """Pallas kernels equal their references on the device, on random inputs with PAD entries."""
    rng = np.random.default_rng(0)
    impls = ["mosaic_gpu", "triton"] if jax.default_backend() == "gpu" else ["triton_interpret"]
    srcs = [jnp.asarray(rng.integers(0, 256, (3, 16, 1728), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (2, 16, 37440), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (1, 16, 5, 16), dtype=np.uint8))]
    bf = [jnp.asarray(rng.standard_normal((4, 16, 2, 8, 256, 64)).astype(jnp.bfloat16))]
    res = {}
    for impl, (label, s) in [(i, c) for i in impls for c in (("uint8", srcs), ("bf16", bf))]:
        label = f"{impl}/{label}"
        idx = np.array([5, -1, 0, 15, 3, 9, -1, 2], np.int32)
        a = pk.gather_pages(s, idx, impl=impl)
        b = pk.gather_pages_reference(s, idx)
        st = jnp.asarray(rng.integers(0, 256, a.shape, dtype=np.uint8)).view(a.dtype) if a.dtype == jnp.uint8 else \
            jnp.asarray(rng.standard_normal(a.shape).astype(a.dtype))
        x = pk.scatter_pages([t + 0 for t in s], st, idx, impl=impl)
        y = pk.scatter_pages_reference(s, st, idx)
        res[label] = {"gather": bool(jnp.all(a == b)), "scatter": all(bool(jnp.all(p == q)) for p, q in zip(x, y))}
    bench.results["kernel_correctness"] = res
    print("kernel correctness:", res, flush=True)
