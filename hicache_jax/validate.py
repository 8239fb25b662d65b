"""Argument checks shared by the public edge and the control plane (pure Python + numpy).

Every check raises `ValueError` naming the argument and the value it was given, so a
caller mistake never surfaces as a `TypeError` from deep inside, and never after
something has already changed: callers check every argument before they take anything.
"""
from __future__ import annotations

import math

import numpy as np


def count(name: str, value, minimum: int = 0) -> int:
    """`value` as an int >= `minimum`: Python and numpy integers only (no bools, floats, strings)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def flag(name: str, value) -> bool:
    """`value` as a bool: Python and numpy bools only."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return bool(value)


def number(name: str, value, *, positive: bool = True) -> float:
    """`value` as a finite float (> 0 when `positive`); ints and numpy numbers accepted, bools not."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a finite number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value) or (positive and value <= 0):
        raise ValueError(f"{name} must be a finite {'positive ' if positive else ''}number, got {value!r}")
    return float(value)


def page_ids(name: str, values) -> np.ndarray:
    """i64[n] page ids from a 1-D sequence of integers; floats (even integral ones), bools,
    negatives and nested shapes raise, so nothing is ever silently truncated."""
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype.kind in "iu":   # the hot path
        if values.size and values.min() < 0:
            raise ValueError(f"{name} must be non-negative page ids, got {values.tolist()}")
        return values.astype(np.int64, copy=False)
    arr = values if isinstance(values, np.ndarray) else np.asarray(list(values) if not np.isscalar(values) else values)
    if arr.size == 0 and arr.ndim <= 1:
        return np.zeros((0,), np.int64)
    if arr.ndim != 1 or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D sequence of integer page ids, got {_describe(values, arr)}")
    if arr.min() < 0:
        raise ValueError(f"{name} must be non-negative page ids, got {arr.tolist()}")
    return arr.astype(np.int64, copy=False)


def page_map(name: str, mapping) -> dict[int, int]:
    """{int: int} from a mapping of integer logical pages to integer page ids."""
    if mapping is None:
        return {}
    if not hasattr(mapping, "items"):
        raise ValueError(f"{name} must be a mapping {{logical page: page id}}, got {type(mapping).__name__}")
    return {count(f"{name} key", k): count(f"{name}[{k!r}]", v) for k, v in mapping.items()}


def page_needs(anchor: str, swa: str | None, pages, swa_pages, what: str = "pages") -> dict[str, int]:
    """`{allocator: pages}` of a request for `pages` anchor and `swa_pages` SWA pages (the
    SWA entry present whenever the layout has an SWA allocator `swa`)."""
    need = {anchor: count(what, pages)}
    swa_pages = count("swa_pages", swa_pages)
    if swa is not None:
        need[swa] = swa_pages
    elif swa_pages:
        raise ValueError(f"swa_pages={swa_pages} but this layout has no SWA pool")
    return need


def windows(swa: str | None, swa_pages) -> dict[str, dict[int, int]] | None:
    """`{swa: {logical page: SWA page}}` of an insert's `swa_pages` (None: not given)."""
    if swa_pages is None:
        return None
    swa_pages = page_map("swa_pages", swa_pages)
    if swa is None and swa_pages:
        raise ValueError("swa_pages given, but this layout has no SWA pool")
    return {swa: swa_pages} if swa is not None else None


def token_seqs(seqs, as_tokens) -> list[np.ndarray]:
    """A list or tuple of token sequences, each through `as_tokens` and not empty."""
    if not isinstance(seqs, (list, tuple)):
        raise ValueError(f"acquire_many takes a list or tuple of token sequences, got {type(seqs).__name__}")
    out = []
    for i, tokens in enumerate(seqs):
        try:
            arr = as_tokens(tokens)
        except ValueError as e:
            raise ValueError(f"acquire_many: token sequence {i}: {e}") from None
        if arr.size == 0:
            raise ValueError(f"acquire_many: token sequence {i} is empty")
        out.append(arr)
    return out


def _describe(values, arr: np.ndarray) -> str:
    if arr.dtype == object or arr.dtype.kind in "US":
        return repr(values)[:80]
    return f"{arr.dtype} of shape {arr.shape}: {np.asarray(arr).ravel()[:8].tolist()}"
