"""A minimal serving loop over a paged model: with HiCache, and with no cache at all.

One request = a prompt plus up to `gen` greedy tokens (fewer when it samples a stop
token). Every forward is one aligned chunk of `model.chunk_size` positions
(`model.forward_chunk`), prefill and decode alike, so each token's state is the same
function of the token history wherever that history came from. With the cache:

    acquire (match, lock, load back a host hit) -> alloc the rest -> prefill + decode
          -> insert whole pages (with the SWA pages the window policy keeps) -> free the rest
          -> unlock -> step
"""
from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

import hicache_jax as hc
from examples import gc_pauses, program_runs

EVERY_PAGE = hc.WindowPolicy.parse("every")     # every page boundary stays a stop point


@dataclasses.dataclass
class Outcome:
    """What one request produced, and where its prompt came from."""

    tokens: list[int]                       # generated tokens
    logits: list[np.ndarray]                # f32[vocab] behind each generated token
    ttft_s: float                           # first token's latency (prompt prefill included)
    gc_s: float = 0.0                       # of that, the garbage collector's pauses (examples/gc_pauses.py)
    cache_s: float = 0.0                    # of that, the cache's calls before the first forward (step, acquire, alloc)
    first_runs: int = 0                     # transfer programs it ran for the first time (program_runs.py)
    device_hit: int = 0                     # prompt tokens found on device
    host_hit: int = 0                       # prompt tokens loaded back from host
    storage_hit: int = 0                    # of those, tokens just fetched from the storage tier
    computed: int = 0                       # prompt tokens prefilled
    resume_len: int | None = None           # set when the request was preempted
    finished: bool = False                  # `gen` tokens, or a stop token, were generated


class PagedRequest:
    """Runs forwards for one sequence over page tables (logical page -> device page)."""

    def __init__(self, model, pools, seq: np.ndarray, anchor: list[int], swa: dict[int, int], landing=None):
        self.model, self.pools, self.seq = model, pools, list(seq.tolist())
        self.anchor, self.swa = anchor, swa     # swa: logical page -> SWA device page
        self.landing, self.landed = landing, None   # a deferred load: the first forward lands it

    def forward(self, end: int, logits: bool = True) -> np.ndarray | None:
        """Compute positions up to `end` (exclusive) of the chunk holding end - 1; logits of end - 1
        (None when not asked for)."""
        C, m = self.model.chunk_size, self.model.max_pages
        q = (end - 1) // C
        tokens = np.zeros(C, np.int32)
        chunk = self.seq[q * C:end]
        tokens[:len(chunk)] = chunk
        a = np.zeros(m, np.int32)
        a[:len(self.anchor)] = self.anchor
        s = np.zeros(m, np.int32)
        for k, v in self.swa.items():
            s[k] = v
        self.pools, out = self.model.forward_chunk(self.pools, a, s, tokens, q * C, end - q * C, logits=logits,
                                                   landing=self.landing)
        if self.landing is not None:
            self.landing, self.landed = None, self.landing
        return None if out is None else np.asarray(out)

    def prefill(self, start: int) -> np.ndarray:
        """Prefill from page-aligned `start` to the end of the sequence; the last logits."""
        C, n = self.model.chunk_size, len(self.seq)
        last = -(-n // C) - 1
        logits = None
        for q in range(start // C, last + 1):
            logits = self.forward(min(n, (q + 1) * C), logits=q == last)
        return logits

    def decode(self, first_logits: np.ndarray, gen: int, out: Outcome, stop_after: int | None = None,
               stop_tokens: frozenset[int] = frozenset()) -> None:
        """Greedy tokens until `gen` in total or a stop token (or `stop_after` more), extending `out`."""
        logits = first_logits
        while not out.finished:
            tok = int(np.argmax(logits))
            out.tokens.append(tok)
            out.logits.append(logits)
            self.seq.append(tok)
            out.finished = len(out.tokens) == gen or tok in stop_tokens
            if out.finished or (stop_after is not None and len(out.tokens) >= stop_after):
                return
            logits = self.forward(len(self.seq))


def run_cached(cache: hc.HiCache, model, prompt: np.ndarray, gen: int, out: Outcome | None = None,
               preempt_at: int | None = None, stop_tokens: frozenset[int] = frozenset(),
               window_policy: hc.WindowPolicy = EVERY_PAGE, overlap: bool = False) -> Outcome:
    """Serve one request through `cache`. With `preempt_at`, leave after that many tokens
    (whole pages stay cached, the rest is recomputed on resume: `out.resume_len`).
    `window_policy`: the page boundaries whose SWA pages the tree keeps, the others are freed
    (default: every page, as chat.py serves; decode.py passes its --window-policy).
    `overlap`: a host hit is a deferred load that the first prefill chunk lands layer group
    by layer group (`Landing`), instead of a load waited for before it."""
    P = model.page_size
    swa_alloc = cache.swa_allocator
    out = out or Outcome([], [], 0.0)
    seq = np.concatenate([prompt, np.asarray(out.tokens, np.int32)]).astype(np.int32)
    t0, g0, r0 = time.perf_counter(), gc_pauses.spent(), program_runs.first_runs()
    cache.step()               # apply what completed since the last request
    prefix = cache.acquire(seq, deferred=overlap)
    usable, table, window = prefix.length, prefix.device_pages, prefix.swa_pages
    out.device_hit += prefix.device_tokens
    out.host_hit += prefix.host_tokens
    out.storage_hit += prefix.storage_tokens
    first, total = usable // P, -(-(len(prompt) + gen) // P)
    grant = cache.alloc(total - first, total - first if swa_alloc else 0)
    if grant is None:
        raise RuntimeError(f"device pool too small for a request of {total} pages")
    new = grant[cache.anchor].tolist()
    swa_new = grant[swa_alloc].tolist() if swa_alloc else []
    swa = {first - len(window) + i: int(p) for i, p in enumerate(window)}
    swa.update({first + i: p for i, p in enumerate(swa_new)})
    req = PagedRequest(model, cache.device_pools, seq, table.tolist() + new, swa, prefix.landing)
    cache_s = time.perf_counter() - t0
    logits = req.prefill(usable)
    out.computed += len(seq) - usable
    if not out.ttft_s:
        jax.block_until_ready(req.pools)
        out.ttft_s, out.gc_s, out.cache_s = time.perf_counter() - t0, gc_pauses.spent() - g0, cache_s
        out.first_runs = program_runs.first_runs() - r0
    req.decode(logits, gen, out, stop_after=preempt_at, stop_tokens=stop_tokens)
    cache.set_device_pools(req.pools, landed=req.landed)
    n = len(req.seq) - 1          # the last token was sampled, not yet computed
    whole = n // P
    # the tree keeps the SWA pages of the windows ending at the policy's stop points, where a
    # later request may resume (always the last whole page boundary of `n`: a resume after
    # preemption, or the next turn); under SWA pressure it drops the least recently used ones
    pages = window_policy.keep_pages(n, P, cache.window_pages, first) if swa_alloc else ()
    keep = {q: swa[q] for q in sorted(pages)}
    if not out.finished:
        out.resume_len = cache.retract(req.seq[:n], req.anchor[:-(-n // P)], keep)
        extra_pages = req.anchor[-(-n // P):]
    else:
        cache.insert(np.asarray(req.seq[:whole * P], np.int32), req.anchor[:whole], keep)
        extra_pages = req.anchor[whole:]
    if extra_pages:
        cache.free(cache.anchor, extra_pages)
    unused_swa = [p for p in swa_new if p not in keep.values()]
    if unused_swa:
        cache.free(swa_alloc, unused_swa)
    cache.unlock(prefix.lock)
    cache.step()
    return out


def run_uncached(model, pools, prompt: np.ndarray, gen: int, stop_tokens: frozenset[int] = frozenset()):
    """The same request with no cache: every prompt token is recomputed. Returns (pools, Outcome)."""
    P = model.page_size
    n_pages = -(-(len(prompt) + gen) // P)
    pages = list(range(n_pages))
    t0, g0 = time.perf_counter(), gc_pauses.spent()
    req = PagedRequest(model, pools, prompt, pages, {q: q for q in range(n_pages)})
    logits = req.prefill(0)
    jax.block_until_ready(req.pools)
    out = Outcome([], [], time.perf_counter() - t0, gc_pauses.spent() - g0, computed=len(prompt))
    req.decode(logits, gen, out, stop_tokens=stop_tokens)
    return req.pools, out
