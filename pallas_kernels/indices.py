"""Host-side checks of page index arrays, run before any device work.

JAX clamps out-of-range gather indices and drops or clamps out-of-range scatter indices
without a word, so a wrong index silently moves the wrong page. Every kernel entry point
checks its index array here first, while it is still a concrete numpy array.

`PAD` marks an entry that moves nothing: a gather reads some valid page for it (its row is
unspecified) and a scatter writes nothing for it. Padding lets callers round batch sizes
up to a few fixed shapes, so steady workloads never recompile.
"""
from __future__ import annotations

import numpy as np

PAD = -1


def check_indices(indices, num_pages: int, *, unique: bool, what: str = "indices") -> np.ndarray:
    """Validate `indices` (i32[n]: pages in [0, num_pages) or PAD) and return them as numpy.

    Raises ValueError naming the offending values when the array is not a 1-D int32 array,
    holds a value outside [0, num_pages) other than PAD, or (with `unique`) repeats a page.
    """
    arr = np.asarray(indices)
    if arr.dtype != np.int32:
        raise ValueError(f"{what} must be int32, got {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    real = arr[arr != PAD]
    bad = real[(real < 0) | (real >= num_pages)]
    if bad.size:
        raise ValueError(f"{what} {bad[:8].tolist()} outside 0..{num_pages - 1} (and not PAD={PAD})")
    if unique and real.size:
        values, counts = np.unique(real, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"{what} repeat pages {values[counts > 1][:8].tolist()}: a scatter needs unique pages")
    return arr
