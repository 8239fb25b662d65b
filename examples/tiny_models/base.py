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
each layer group just before the first layer that reads it (`LandingSchedule.before_layer`), so
the copy of a prefix from the host runs under the chunk's compute.

A batched serving loop runs several sequences in one program:

    pools, logits = model.forward_batch(pools, slots)     # slots: a SlotBatch of B slots

runs slots 0 .. count - 1 one after the other, each the per-sequence chunk above on its
own tokens, start, valid and page tables, with the pools threaded through, and returns
f32[B, vocab] (the last valid row's logits per slot; rows >= count are zero and those slots
write nothing). With `every_slot=True` all B slots run, those past count on the pages
their tables name (a trash page), and nothing in the program waits on `count`. A slot is
the same computation whatever the other slots hold and whichever slot it is in, so a
sequence gets the same bits in a full batch as alone (count = 1).
Slots run one after another rather than as one [B x chunk_size]-row computation: wider
matmuls round differently, and a token's bits must not depend on what it was batched with.
What a batch saves is per-step dispatch and host round trips, not arithmetic. A batched
step takes no landing: its host hits are loaded before it (see examples/batching).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hicache_jax.layout import PoolLayout
from hicache_jax.transfer import step_compiler_options
from examples.tiny_models.paged import Chunk


_STEPS: dict[tuple, object] = {}   # (model class, layout, max_pages, chunk_size) -> the jitted step
_BATCH_STEPS: dict[tuple, object] = {}   # the same key -> the jitted batched step


class SlotBatch(NamedTuple):
    """The inputs of one batched step (`ChunkModel.forward_batch`): B slots, the first
    `count` computed. Row i is slot i's arguments of `forward_chunk`. A pytree of arrays,
    so one batch size and model compile one program whatever `count` and the rows hold.

        count          i32[]                 slots computed: 0 .. count - 1 (0 .. B)
        tokens         i32[B, chunk_size]    the chunk's tokens (padding past valid: anything)
        start          i32[B]                first position of the chunk (a multiple of chunk_size)
        valid          i32[B]                real rows of the chunk, 1 .. chunk_size
        anchor_pages   i32[B, max_pages]     logical page -> anchor device page
        swa_pages      i32[B, max_pages]     logical page -> SWA device page
        logits         bool[B]               compute this slot's logits (a model may skip its head)
    """

    count: np.ndarray
    tokens: np.ndarray
    start: np.ndarray
    valid: np.ndarray
    anchor_pages: np.ndarray
    swa_pages: np.ndarray
    logits: np.ndarray


class ChunkModel:
    """Base class: argument checks, the single jit, and the two entry points.

    Subclasses set `self.params` in `__init__` (after calling this one) and implement
    `_chunk(params, pools, chunk, tokens, schedule) -> (pools, logits f32[page_size, vocab])`,
    calling `pools, x = schedule.before_layer(layer, pools, x)` before each layer when
    `schedule` is not None.
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
        # Compiled with the options that keep a step's bits independent of a landing it carries
        # (and the batched step's slots equal to the step alone): hicache_jax.step_compiler_options.
        key = (type(self), layout, max_pages, chunk_size)
        if key not in _STEPS:
            _STEPS[key] = jax.jit(self._forward, donate_argnums=(1,), compiler_options=step_compiler_options())
        self._step = _STEPS[key]
        self._batch_key = key

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

    def forward_batch(self, pools, slots: SlotBatch, every_slot: bool = False):
        """(pools, logits f32[B, vocab]): slots 0 .. count - 1 of `slots`, one after the other.

        Slot i runs the per-sequence chunk (`_forward`, what `forward_chunk` runs) on its
        own row: tokens[i], start[i], valid[i], its page tables, on the pools the slots before
        it left, all inside one jitted program (a loop over the slots, `count` a traced bound).
        Its bits depend only on its row and the pool pages it reads, never on the other slots
        or on which slot it is, so a sequence computed in a full batch equals the same
        sequence in a batch of one (count = 1), by construction; it also equals
        `forward_chunk` on the CPU (tests/models/test_forward_batch.py), though that is
        another program. Slots >= count are not computed (no cost, no writes) and get zero
        logits. logits[i] False lets a model skip its head for slot i (Gemma then returns
        zeros there; the tiny models compute them anyway). Slots computed together must
        write different pages (they are different sequences; shared prefix pages are only
        read). `pools` are donated. Numpy rows of computed slots are range-checked like
        `forward_chunk`'s arguments; jax arrays pass unchecked (that would need a device sync).

        `every_slot=True` (another program) computes all B slots in a loop of fixed trip
        count, so the host has control back once the step is queued: on a GPU the traced
        loop's bound is read on the host every slot, which holds the caller until the step is
        done. Slots >= count then run on whatever their rows hold and write the pages their
        tables name: the caller points them at a trash page no sequence reads (`pack`'s
        `trash`). Their logits are zero, and every computed slot's bits are as above.
        """
        check_pools(self.layout, pools)
        slots = self._checked_slots(slots)
        key = (self._batch_key, bool(every_slot))
        if key not in _BATCH_STEPS:
            _BATCH_STEPS[key] = jax.jit(functools.partial(self._forward_batch, every_slot=bool(every_slot)),
                                        donate_argnums=(1,), compiler_options=step_compiler_options())
        return _BATCH_STEPS[key](self.params, dict(pools), slots)

    def pool_shapes(self, num_anchor_pages: int, num_swa_pages: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """{pool name: (shape, dtype)} of the pool arrays this model expects."""
        out = {}
        for p in self.layout.byte_pools:
            n = num_anchor_pages if p.allocator == self.layout.anchor.name else num_swa_pages
            out[p.name] = ((p.num_layers, n, *p.page_shape), p.dtype)
        return out

    # ---- internals ----------------------------------------------------------------------

    def _chunk(self, params, pools, chunk: Chunk, tokens, schedule):
        raise NotImplementedError

    def _forward(self, params, pools, anchor_pages, swa_pages, tokens, start, valid, want_logits, landing):
        # the tiny models compute every row's logits (cheap): `want_logits` is not needed
        chunk = Chunk.make(self.page_size, anchor_pages, swa_pages, start, valid, rows=self.chunk_size)
        tokens = jnp.clip(tokens, 0, self.vocab_size - 1)  # padding may hold anything
        schedule = landing.schedule() if landing is not None else None
        pools, logits = self._chunk(params, pools, chunk, tokens, schedule)
        if schedule is not None:
            pools = schedule.finish(pools)
        last = jax.lax.dynamic_index_in_dim(logits, valid - 1, axis=0, keepdims=False)
        return pools, logits, last

    def _forward_batch(self, params, pools, slots: SlotBatch, every_slot: bool = False):
        # a fori_loop with a traced bound, not a scan with a masked body: slots past `count`
        # cost nothing, and the body is the per-sequence `_forward` itself (no landing), so a
        # slot is the same computation as in any other batch or alone. `every_slot`: the
        # bound is B and slots past `count` get zero logits (forward_batch)
        def body(i, carry):
            pools, out = carry
            pools, _, last = self._forward(params, pools, slots.anchor_pages[i], slots.swa_pages[i],
                                           slots.tokens[i], slots.start[i], slots.valid[i], slots.logits[i], None)
            last = last.astype(jnp.float32)
            if every_slot:
                last = jnp.where(i < slots.count, last, jnp.zeros_like(last))
            return pools, jax.lax.dynamic_update_index_in_dim(out, last, i, 0)

        B = slots.tokens.shape[0]
        out = jnp.zeros((B, self.vocab_size), jnp.float32)
        return jax.lax.fori_loop(0, B if every_slot else slots.count, body, (pools, out))

    def _checked_slots(self, slots) -> SlotBatch:
        if not isinstance(slots, SlotBatch):
            raise ValueError(f"forward_batch takes a SlotBatch, got {type(slots).__name__}")
        shape = np.shape(slots.tokens)
        B = shape[0] if len(shape) == 2 else 0
        if B < 1 or shape[1] != self.chunk_size:
            raise ValueError(f"SlotBatch.tokens must be int[B >= 1, {self.chunk_size}], got {list(shape)}")
        want = {"tokens": (B, self.chunk_size), "start": (B,), "valid": (B,), "anchor_pages": (B, self.max_pages),
                "swa_pages": (B, self.max_pages), "logits": (B,)}
        out = {"count": _i32_scalar("count", slots.count)}
        for name, dims in want.items():
            x = getattr(slots, name)
            kind = np.bool_ if name == "logits" else np.integer
            dtype = x.dtype if isinstance(x, (jax.Array, np.ndarray)) else np.asarray(x).dtype
            if np.shape(x) != dims or not np.issubdtype(dtype, kind):
                raise ValueError(f"SlotBatch.{name} must be {'bool' if name == 'logits' else 'int'}{list(dims)}, "
                                 f"got {dtype}{list(np.shape(x))}")
            out[name] = x if isinstance(x, jax.Array) else np.asarray(x, np.bool_ if name == "logits" else np.int32)
        if isinstance(out["count"], np.int32):
            n = int(out["count"])
            if not 0 <= n <= B:
                raise ValueError(f"SlotBatch.count must be in 0..{B}, got {n}")
            if isinstance(out["start"], np.ndarray) and isinstance(out["valid"], np.ndarray):
                for i in range(n):
                    try:
                        self._check_range(int(out["start"][i]), int(out["valid"][i]))
                    except ValueError as e:
                        raise ValueError(f"slot {i}: {e}") from None
        return SlotBatch(**out)

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
