"""The contract every paged model follows: one jitted, fixed-shape forward per chunk.

    pools, logits = model.forward_chunk(pools, anchor_pages, swa_pages, tokens, start, valid)

computes positions `start .. start + valid - 1` of the chunk of `chunk_size` positions at
`start` (a multiple of `chunk_size`, which divides `page_size`: a chunk never straddles
pages; the tiny models use whole pages) on logical page `start // page_size`, and returns
the donated, updated pools and the f32[vocab] logits of the last valid position.
Decode is the same call with `valid` grown by one, so a token's stored state is always
computed by the same function from the same inputs: the chunk's tokens and the bytes of
earlier positions. It writes only the current page of each pool (anchor page for
kv-indexed pools, SWA page for SWA-indexed ones) and reads earlier pages only where the
position masks admit them; other table entries may name any page holding any bytes.

`landing=` (a deferred load-back's `hicache_jax.Landing`) is landed inside the same jit,
each layer group just before the first layer that reads it (`Lander.before_layer`), so
the copy of a prefix from the host runs under the chunk's compute.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hicache_jax.layout import PoolLayout
from examples.tiny_models.paged import Chunk


_STEPS: dict[tuple, object] = {}   # (model class, layout, max_pages, chunk_size) -> the jitted step


class ChunkModel:
    """Base class: argument checks, the single jit, and the two entry points.

    Subclasses set `self.params` in `__init__` (after calling this one) and implement
    `_chunk(params, pools, chunk, tokens, lander) -> (pools, logits f32[page_size, vocab])`,
    calling `pools, x = lander.before_layer(layer, pools, x)` before each layer when
    `lander` is not None.
    """

    def __init__(self, layout: PoolLayout, max_pages: int, chunk_size: int | None = None):
        cfg = layout.model
        if not isinstance(max_pages, int) or max_pages < 1:
            raise ValueError(f"max_pages must be a positive int, got {max_pages!r}")
        chunk_size = layout.page_size if chunk_size is None else chunk_size
        if not isinstance(chunk_size, int) or chunk_size < 1 or layout.page_size % chunk_size:
            raise ValueError(f"chunk_size must be a positive divisor of page_size {layout.page_size}, got {chunk_size!r}")
        if cfg.vocab_size <= 0:
            raise ValueError(f"config {cfg.name!r}: vocab_size must be positive for a model, got {cfg.vocab_size}")
        self.layout = layout
        self.config = cfg
        self.page_size = layout.page_size
        self.chunk_size = chunk_size
        self.max_pages = max_pages
        self.vocab_size = cfg.vocab_size
        self.params: dict = {}
        # one jitted step per layout and size: models that differ only in their weights (an
        # argument) share it and its compiled programs. Pools are donated, updated in place.
        key = (type(self), layout, max_pages, chunk_size)
        if key not in _STEPS:
            _STEPS[key] = jax.jit(self._forward, donate_argnums=(1,))
        self._step = _STEPS[key]

    # ---- public API -------------------------------------------------------------------

    def forward_chunk(self, pools, anchor_pages, swa_pages, tokens, start, valid, logits: bool = True, landing=None):
        """(pools, logits f32[vocab]) of position start + valid - 1; see the module docstring.

        pools: {name: u8/bf16[num_layers, num_pages, *page_shape]} for every byte pool of the
        layout (donated: do not reuse the dict passed in); anchor_pages, swa_pages:
        i32[max_pages]; tokens: i32[chunk_size]; start, valid: ints or i32 scalars (a jax
        array is passed through unchecked: checking it would need a device sync).
        `logits=False` (a prefill chunk before the last) returns None for the logits and
        lets a model skip its head; the same compiled program runs, so the pools are the same.
        `landing`: a deferred load to land in this chunk's jit (module docstring).
        """
        pools, _, last = self._call(pools, anchor_pages, swa_pages, tokens, start, valid, logits, landing)
        return pools, last if logits else None

    def forward_chunk_all(self, pools, anchor_pages, swa_pages, tokens, start, valid):
        """Like `forward_chunk`, but the logits of every row: f32[page_size, vocab].

        Rows >= valid hold finite values that mean nothing. Same compiled program as
        `forward_chunk`, so `all[valid - 1]` equals its logits bit for bit.
        """
        pools, logits, _ = self._call(pools, anchor_pages, swa_pages, tokens, start, valid, True)
        return pools, logits

    def pool_shapes(self, num_anchor_pages: int, num_swa_pages: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """{pool name: (shape, dtype)} of the pool arrays this model expects."""
        out = {}
        for p in self.layout.byte_pools:
            n = num_anchor_pages if p.allocator == self.layout.anchor.name else num_swa_pages
            out[p.name] = ((p.num_layers, n, *p.page_shape), p.dtype)
        return out

    # ---- internals ----------------------------------------------------------------------

    def _chunk(self, params, pools, chunk: Chunk, tokens, lander):
        raise NotImplementedError

    def _forward(self, params, pools, anchor_pages, swa_pages, tokens, start, valid, want_logits, landing):
        # the tiny models compute every row's logits (cheap): `want_logits` is not needed
        chunk = Chunk.make(self.page_size, anchor_pages, swa_pages, start, valid, rows=self.chunk_size)
        tokens = jnp.clip(tokens, 0, self.vocab_size - 1)  # padding may hold anything
        lander = landing.lander() if landing is not None else None
        pools, logits = self._chunk(params, pools, chunk, tokens, lander)
        if lander is not None:
            pools = lander.finish(pools)
        last = jax.lax.dynamic_index_in_dim(logits, valid - 1, axis=0, keepdims=False)
        return pools, logits, last

    def _call(self, pools, anchor_pages, swa_pages, tokens, start, valid, want_logits: bool, landing=None):
        check_pools(self.layout, pools)
        anchor_pages = _i32_vector("anchor_pages", anchor_pages, self.max_pages)
        swa_pages = _i32_vector("swa_pages", swa_pages, self.max_pages)
        tokens = _i32_vector("tokens", tokens, self.chunk_size)
        start, valid = _i32_scalar("start", start), _i32_scalar("valid", valid)
        if isinstance(start, np.int32) and isinstance(valid, np.int32):
            self._check_range(int(start), int(valid))
        return self._step(self.params, dict(pools), anchor_pages, swa_pages, tokens, start, valid,
                          np.bool_(want_logits), landing)

    def _check_range(self, start: int, valid: int) -> None:
        P, C = self.page_size, self.chunk_size
        if start < 0 or start % C:
            raise ValueError(f"start must be a non-negative multiple of chunk_size {C}, got {start}")
        if start // P >= self.max_pages:
            raise ValueError(f"start {start} is on logical page {start // P}, beyond max_pages {self.max_pages}")
        if not 1 <= valid <= C:
            raise ValueError(f"valid must be in 1..{C}, got {valid}")


def check_pools(layout: PoolLayout, pools) -> None:
    """ValueError unless `pools` are exactly `layout`'s byte pools, each of its shape and dtype."""
    want = {p.name: p for p in layout.byte_pools}
    if set(pools) != set(want):
        raise ValueError(f"pools must have exactly the layout's byte pools {sorted(want)}, got {sorted(pools)}")
    pages: dict[str, int] = {}
    for name, spec in want.items():
        arr = pools[name]
        if arr.ndim != 2 + len(spec.page_shape) or arr.shape[0] != spec.num_layers \
                or tuple(arr.shape[2:]) != spec.page_shape or str(arr.dtype) != spec.dtype:
            raise ValueError(f"pool {name!r} must be {spec.dtype}[{spec.num_layers}, num_pages, "
                             f"{', '.join(map(str, spec.page_shape))}], got {arr.dtype}{list(arr.shape)}")
        n = pages.setdefault(spec.allocator, arr.shape[1])
        if arr.shape[1] != n:
            raise ValueError(f"pool {name!r} has {arr.shape[1]} pages but other pools indexed by "
                             f"{spec.allocator!r} have {n}")


def _i32_vector(what: str, x, n: int):
    if isinstance(x, jax.Array):
        if x.shape != (n,):
            raise ValueError(f"{what} must have shape ({n},), got {x.shape}")
        return x.astype(jnp.int32)
    a = np.asarray(x)
    if a.shape != (n,) or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{what} must be int[{n}], got {a.dtype}{list(a.shape)}")
    return a.astype(np.int32)


def _i32_scalar(what: str, x):
    if isinstance(x, jax.Array):
        if x.shape != ():
            raise ValueError(f"{what} must be a scalar, got shape {x.shape}")
        return x.astype(jnp.int32)
    if not isinstance(x, (int, np.integer)) or isinstance(x, bool):
        raise ValueError(f"{what} must be an int, got {x!r}")
    return np.int32(x)
