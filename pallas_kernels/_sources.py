"""Shared argument handling of the page kernels: source shapes, implementations."""
from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from pallas_kernels._triton_offsets import ensure_wide_offsets, needs_wide_offsets
from pallas_kernels.indices import check_indices
from pallas_kernels.row_layout import RowLayout, row_layout, source_dims

IMPLS = ("pallas", "interpret", "reference")
# CUDA caps the second grid axis (one program per page) at 65535.
MAX_PAGES_PER_CALL = 65535


def triton_can_address(arrays) -> bool:
    """Whether the Triton lowering addresses every array correctly (installing the fix if needed).

    False only when an array needs 64-bit offsets and the fix cannot be installed on
    this jax: the caller then uses the jnp reference instead.
    """
    if not any(a is not None and needs_wide_offsets(a.shape, a.dtype) for a in arrays):
        return True
    return ensure_wide_offsets()


def check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}; got {impl!r}")


def describe(sources: Sequence[jax.Array], block_bytes: int, align_bytes: int = 1) -> tuple[RowLayout, int]:
    """(row layout, num_pages) of `sources`; ValueError if they do not share dtype and page count."""
    if not sources:
        raise ValueError("at least one source array is needed")
    dtype, pages = sources[0].dtype, None
    dims = []
    for i, s in enumerate(sources):
        layers, num_pages, elems = source_dims(s.shape)
        if s.dtype != dtype:
            raise ValueError(f"source {i} has dtype {s.dtype}, source 0 has {dtype}: one staging row holds one dtype")
        if pages is not None and num_pages != pages:
            raise ValueError(f"source {i} has {num_pages} pages, source 0 has {pages}")
        pages = num_pages
        dims.append((layers, elems))
    return row_layout(dims, np.dtype(dtype).itemsize, block_bytes, align_bytes), pages


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


def check_staging(staging, layout: RowLayout, dtype, min_rows: int, what: str) -> None:
    if staging.ndim != 2 or staging.shape[1] != layout.row_elems or staging.shape[0] < min_rows:
        raise ValueError(
            f"{what} must be [>= {min_rows}, {layout.row_elems}], got shape {tuple(staging.shape)}")
    if staging.dtype != dtype:
        raise ValueError(f"{what} has dtype {staging.dtype}, the sources {dtype}")
