"""Shared argument handling of the page kernels: implementation names, source shapes, checks."""
from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from collections.abc import Sequence

import jax
import numpy as np

from pallas_kernels.indices import check_indices
from pallas_kernels.pack_layout import PackLayout, layer_ranges, pack_layout, source_dims

BACKENDS = ("mosaic_gpu", "triton", "tpu")
# Every name `impl=` takes: "auto", a backend, the backend interpreted on the CPU, or plain jnp.
IMPLS = ("auto", *BACKENDS, *(f"{b}_interpret" for b in BACKENDS), "reference")
# Block size per backend (bytes): Triton's was the best pack + unpack time of 4-32 KiB on the
# H200 (BENCHMARKS.md); TPU DMAs move whole pages and ignore it.
DEFAULT_BLOCK_BYTES = {"mosaic_gpu": 16384, "triton": 4096, "tpu": 4096, "reference": 4096}
# Backends whose copies need every page (and so every block) to be a multiple of this many bytes.
GRANULE_BYTES = {"mosaic_gpu": 16}
MOSAIC_GPU_MIN_CAPABILITY = 9.0   # bulk async copies (TMA) and mbarriers: Hopper and newer

log = logging.getLogger("pallas_kernels")


def resolve(impl: str, device: jax.Device | None = None) -> tuple[str, bool]:
    """(backend or "reference", interpreted?) of an `impl` name; "auto" looks at `device`
    (default: the first device)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}; got {impl!r}")
    if impl == "auto":
        impl = auto_impl(device or jax.devices()[0])
    if impl.endswith("_interpret"):
        return impl[:-len("_interpret")], True
    return impl, False


def auto_impl(device: jax.Device) -> str:
    """Mosaic GPU on NVIDIA GPUs of compute capability >= 9.0, Triton on older NVIDIA GPUs,
    Pallas TPU on TPUs, the jnp reference elsewhere. Logged once per kind of device."""
    capability = _capability(device)
    if device.platform == "tpu":
        choice, why = "tpu", "TPU"
    elif capability is not None and capability >= MOSAIC_GPU_MIN_CAPABILITY:
        choice, why = "mosaic_gpu", f"NVIDIA GPU, compute capability {capability}"
    elif capability is not None:
        choice, why = "triton", f"NVIDIA GPU, compute capability {capability} < {MOSAIC_GPU_MIN_CAPABILITY}"
    else:
        choice, why = "reference", f"no Pallas kernel for platform {device.platform!r}"
    _log_choice(choice, why, device.device_kind)
    return choice


@functools.cache
def _log_choice(choice: str, why: str, kind: str) -> None:
    log.info("page kernels: %s (%s, %s)", choice, why, kind)


def _capability(device: jax.Device) -> float | None:
    """Compute capability of a CUDA device, None for any other device."""
    if device.platform != "gpu":
        return None
    try:
        return float(getattr(device, "compute_capability", ""))
    except ValueError:
        return None


def backend_module(backend: str):
    return importlib.import_module(f"pallas_kernels.{backend}")


def describe(sources: Sequence[jax.Array], backend: str, block_bytes: int | None,
             align_bytes: int = 1, layers: Sequence[tuple[int, int, int]] | None = None,
             disjoint: bool = False) -> tuple[PackLayout, int]:
    """(row layout, num_pages) of `sources` for `backend`, its segments `layers` (None:
    every source whole); ValueError if the sources do not share dtype and page count, if
    the backend cannot move pages of their size, or if `layers` is bad (`layer_ranges`;
    `disjoint` for a scatter)."""
    if not sources:
        raise ValueError("at least one source array is needed")
    dtype, pages = sources[0].dtype, None
    itemsize = np.dtype(dtype).itemsize
    granule = GRANULE_BYTES.get(backend)
    dims = []
    for i, s in enumerate(sources):
        layers_i, num_pages, elems = source_dims(s.shape)
        if s.dtype != dtype:
            raise ValueError(f"source {i} has dtype {s.dtype}, source 0 has {dtype}: one staging row holds one dtype")
        if pages is not None and num_pages != pages:
            raise ValueError(f"source {i} has {num_pages} pages, source 0 has {pages}")
        if granule and (elems * itemsize) % granule:
            raise ValueError(f"source {i} has pages of {elems * itemsize} B: the {backend} kernels move whole "
                             f"multiples of {granule} B (use another impl, e.g. 'reference')")
        pages = num_pages
        dims.append((layers_i, elems))
    ranges = layer_ranges([d[0] for d in dims], layers, disjoint=disjoint)
    block = DEFAULT_BLOCK_BYTES[backend] if block_bytes is None else block_bytes
    return pack_layout(dims, itemsize, block, align_bytes, granule, ranges), pages


def used_only(layout: PackLayout, sources: Sequence) -> tuple[PackLayout, list, list[int]]:
    """(layout, sources, their indices in `sources`) with the sources no segment names
    left out and the segments renumbered to match (the kernels then never see them)."""
    used = sorted({seg.source for seg in layout.segments})
    if len(used) == len(sources):
        return layout, list(sources), used
    new = {s: k for k, s in enumerate(used)}
    segments = tuple(dataclasses.replace(seg, source=new[seg.source]) for seg in layout.segments)
    return dataclasses.replace(layout, segments=segments), [sources[s] for s in used], used


def flat(source: jax.Array) -> jax.Array:
    """`[L, P, *page_shape]` -> `[L, P, E]` (a free reshape of a row-major array)."""
    layers, pages, elems = source_dims(source.shape)
    return source.reshape(layers, pages, elems)


def maybe_check(indices, num_pages: int, *, unique: bool) -> None:
    """Check concrete indices now; traced ones were checked by the caller before tracing."""
    if isinstance(indices, jax.core.Tracer):
        if indices.dtype != np.int32 or indices.ndim != 1:
            raise ValueError(f"indices must be i32[n], got {indices.dtype}{list(indices.shape)}")
        return
    check_indices(indices, num_pages, unique=unique)


def check_staging(staging, layout: PackLayout, dtype, min_rows: int, what: str) -> None:
    if staging.ndim != 2 or staging.shape[1] != layout.row_elems or staging.shape[0] < min_rows:
        raise ValueError(
            f"{what} must be [>= {min_rows}, {layout.row_elems}], got shape {tuple(staging.shape)}")
    if staging.dtype != dtype:
        raise ValueError(f"{what} has dtype {staging.dtype}, the sources {dtype}")
