"""Work around 32-bit pointer offsets in the Pallas Triton lowering.

jax's Triton lowering switches to 64-bit pointer offsets only when an array exceeds
2**32 *bytes*, but the offsets count *elements* and are added to the base pointer as
*signed* 32-bit integers. A uint8 array of 2**31 to 2**32 elements (e.g. a 3.2 GB V4
c4 pool of 4096 pages) is then addressed at negative offsets past its first 2 GiB:
measured on the H200 with jax 0.11.2, gather and scatter of such pools moved wrong bytes,
while smaller and larger pools were exact.

`ensure_wide_offsets()` wraps the lowering's offset computation so that arrays of 2**31 or
more elements always get 64-bit offsets (for everything else it changes nothing). It
is installed on the first Triton kernel traced, never at import, and is idempotent.
If this jax has no such internal function, it returns False and callers fall back to
the jnp reference for such arrays.
"""
from __future__ import annotations

import math

import jax.numpy as jnp

SIGNED_I32_LIMIT = 2**31


def needs_wide_offsets(shape, dtype) -> bool:
    """Whether an array this big is mis-addressed by the unpatched Triton lowering."""
    n = math.prod(shape)
    return n >= SIGNED_I32_LIMIT and n * jnp.dtype(dtype).itemsize <= 2**32


def triton_can_address(arrays) -> bool:
    """Whether the Triton lowering addresses every array correctly (installing the fix if needed).

    False only when an array needs 64-bit offsets and the fix cannot be installed on
    this jax: the caller then uses the jnp reference instead.
    """
    if not any(a is not None and needs_wide_offsets(a.shape, a.dtype) for a in arrays):
        return True
    return ensure_wide_offsets()


def ensure_wide_offsets() -> bool:
    """Install the 64-bit offset fix; True if it is in place."""
    try:
        from jax._src.pallas.triton import lowering
    except ImportError:
        return False
    original = getattr(lowering, "_compute_offsets_from_indices", None)
    if original is None:
        return False
    if getattr(original, "_wide_offsets", False):
        return True

    def compute_offsets(block_info, nd_indexer, *args, **kwargs):
        aval = block_info.full_shape_dtype
        if needs_wide_offsets(aval.shape, aval.dtype):
            # Only the byte size of this aval picks the offset width: present the array as
            # 4-byte elements of the same shape (strides and offsets stay in elements).
            block_info = type(block_info)(**{**vars(block_info),
                                             "full_shape_dtype": aval.update(dtype=jnp.dtype("float32"))})
        return original(block_info, nd_indexer, *args, **kwargs)

    compute_offsets._wide_offsets = True
    lowering._compute_offsets_from_indices = compute_offsets
    return True
