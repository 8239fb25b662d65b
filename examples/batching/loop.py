"""`serve`: replay jobs through the scheduler and the model's batched step on a simulated clock.

The replay clock starts at 0 with the trace and advances by the wall time of each step,
measured around everything the step does (growing and admitting with their `acquire` /
`alloc` calls and any load they wait for, packing, the jitted model step, `cache.step()`
while the device runs it, fetching its tokens, which waits for it, and the `insert` /
`retract` of the sequences that leave). A request arrives when the clock passes its
arrival time (the trace timestamp x `--time-scale`); when nothing is running or waiting,
the clock jumps to the next arrival. Each token is stamped with the clock at the end of
its step, so:

    TTFT            first token's time - arrival (queueing, prefix loads, prefill, and
                    any preemption before the first token included)
    inter-token     time between a request's consecutive tokens
    throughput      output tokens / (last token's time - first arrival)

The clock is wall time where the loop works and the trace's time where it would be idle,
so a run is as fast as the machine and as loaded as the trace (and `--time-scale`) make it.

A step's work comes in one of two orders:

    in turn   schedule; queue the step; record its chunks (`Scheduler.dispatched`: the
              finished leave); `cache.step()`; fetch its tokens (waits for the device)
    ahead     schedule; fetch the step before's tokens (waits); queue this step;
              record its chunks; `cache.step()`

`ahead` schedules step N + 1 (growing, preempting, admitting: the acquires and the loads
they start) while the device computes step N, as SGLang's overlap scheduler does. What the
schedule needs from step N is which sequences finish, known from lengths, not from token
values; only packing reads the tokens, and it comes after the fetch. The step then
computes every slot (`forward_batch(every_slot=True)`, slots past the batch on a trash
page held for the run), so queueing it does not hold the host until the device is done,
as the traced loop's bound does on a GPU. Tokens are stamped when fetched, in both orders.
"""
from __future__ import annotations

import collections
import dataclasses
import time

import numpy as np

import hicache_jax as hc
from examples import gc_pauses
from examples.batching.modes import CacheCalls, CacheKind
from examples.batching.progress import ProgressBar
from examples.batching.scheduler import Scheduler
from examples.batching.sequence import Sequence
from examples.batching.slots import pack, pick
from examples.batching.workload import Job


# the parts of a step, timed apart: `cache.step()` (dispatched after the model's step, so
# its host time overlaps the device's work); scheduling (grow, preempt, admit: the acquire /
# alloc calls and the loads they wait for); the model step packed, queued and its tokens
# fetched (which waits for it); advancing the sequences (their chunks recorded; the
# finished ones' insert / free / unlock)
PHASES = ("cache_step", "schedule", "model", "advance")


@dataclasses.dataclass(frozen=True)
class StepRecord:
    clock_s: float       # replay clock at the end of the step
    wall_s: float        # the step's wall time
    batch: int           # sequences computed together
    tokens: int          # tokens generated
    phase_s: tuple[float, ...]   # the step's wall time by part (PHASES, in order)
    fetch_s: float       # of "model": fetching the tokens, i.e. waiting for the device to finish the step
    programs: int        # transfer programs the cache ran in the step
    dispatch_s: float    # of which in the engine's `start` (transfers dispatched) ...
    wait_s: float        # ... and in waits for transfers in flight (`HiCache.time_phases`)

    @staticmethod
    def columns() -> list[str]:
        """The names of `row()`'s values: the fields, `phase_s` spread as "<part>_s"."""
        return [n for f in dataclasses.fields(StepRecord)
                for n in ([f"{p}_s" for p in PHASES] if f.name == "phase_s" else [f.name])]

    def row(self) -> list[float]:
        """The record as one flat row (`columns()`)."""
        return [v for f in dataclasses.fields(self)
                for v in (getattr(self, f.name) if f.name == "phase_s" else [getattr(self, f.name)])]


@dataclasses.dataclass
class Run:
    """What one replay produced: every request's tokens and timings, every step, the cache's counters."""

    kind: CacheKind
    sequences: list[Sequence]       # in trace order
    steps: list[StepRecord]
    preemptions: int
    refused_admissions: int
    stats: hc.CacheStats
    wall_s: float
    phase_s: dict[str, float]       # wall time per part of the steps (PHASES)
    background_compiles: int        # fused load programs compiled on the engine's thread meanwhile
    background_compile_s: float     # their XLA compile time (tracing and lowering not included)
    program_calls: dict[str, int]   # transfer programs the cache ran, by kind ("plan:load_pieces": fused loads)
    cache_phases_s: dict[str, float]  # the cache's calls by phase (`HiCache.time_phases`: match, plan, dispatch, wait)
    gc_s: float                     # the garbage collector's pauses meanwhile (examples/gc_pauses.py)
    gc_full_passes: int             # of which full (generation 2) passes


def serve(jobs: list[Job], model, calls: CacheCalls, max_batch: int, sample: frozenset[int] = frozenset(),
          progress: bool = True, admission: str = "eager", ahead: bool = False) -> Run:
    """Serve `jobs` (in arrival order) through `calls` with `model.forward_batch` on `max_batch`
    slots. `sample`: job indices whose full logits rows are kept (for the identity check);
    `admission`: the scheduler's (`Scheduler`: "eager" or "reserve"); `ahead`: schedule each
    step while the device computes the one before (module docstring). The cache's pools must
    have had the step compiled on them (`warm_up`, with the same `ahead`)."""
    sched = Scheduler(calls, model.chunk_size, max_batch, admission)
    C, M, rows = model.chunk_size, model.max_pages, min(len(sample), max_batch)
    pending = collections.deque(jobs)
    seqs: list[Sequence] = []
    steps: list[StepRecord] = []
    bar = ProgressBar(calls.kind.value, len(jobs), enabled=progress)
    clock, done, t_start = 0.0, 0, time.perf_counter()
    phases = dict.fromkeys(PHASES, 0.0)
    compiles = hc.CompileCounter()
    gc0 = gc_pauses.spent(), gc_pauses.full_passes()
    program_calls = collections.Counter()
    trash = hold_trash(calls.cache) if ahead else (0, 0)

    def count(label, program, *args):             # the cache's transfer programs, by kind
        program_calls[label.split("[")[0]] += 1
        return program(*args)

    def queue(batch):                             # the step of `batch`, queued: (sampled slots, its picks)
        slots = pack(batch, max_batch, C, M, trash)
        pools, logits = model.forward_batch(calls.cache.device_pools, slots, every_slot=ahead)
        calls.cache.set_device_pools(pools)
        wanted = [i for i, s in enumerate(batch) if slots.logits[i] and s.job.index in sample]
        return wanted, pick(logits, np.asarray(wanted + [0] * (rows - len(wanted)), np.int32))

    def fetch(step):                              # waits for the step; its tokens go to their sequences
        expected, (wanted, (tokens, digests, kept)) = step
        kept = dict(zip(wanted, np.asarray(kept))) if wanted else None
        return Scheduler.deliver(expected, np.asarray(tokens), np.asarray(digests), kept)

    calls.cache.on_program_call(count)
    cache_phases = calls.cache.time_phases()      # where the schedule's cache calls spend their time
    in_flight = None                              # (expected tokens, queued step) not fetched yet
    while pending or sched.busy or in_flight:
        calls0 = sum(program_calls.values())
        cache0 = cache_phases.get("dispatch", 0.0), cache_phases.get("wait", 0.0)
        if not sched.busy and in_flight is None:
            clock = max(clock, pending[0].arrival_s)        # idle: the next arrival comes
        while pending and pending[0].arrival_s <= clock:
            seqs.append(sched.arrive(pending.popleft()))
        t0 = time.perf_counter()
        batch = sched.schedule()
        t1 = time.perf_counter()
        got = []
        if ahead and in_flight:
            got, in_flight = fetch(in_flight), None
        t2 = time.perf_counter()
        queued = queue(batch) if batch else None
        t3 = time.perf_counter()
        if batch:                 # the finished leave: their inserts' backups go in this step
            in_flight = sched.dispatched(batch), queued
        t4 = time.perf_counter()
        calls.step()              # backups dispatch while the device runs the step
        t5 = time.perf_counter()
        if not ahead and in_flight:
            got, in_flight = fetch(in_flight), None
        t6 = time.perf_counter()
        fetch_s, dt = t2 - t1 + t6 - t5, t6 - t0
        parts = (t5 - t4, t1 - t0, t3 - t2 + fetch_s, t4 - t3)
        for phase, spent in zip(PHASES, parts):
            phases[phase] += spent
        fetched = clock + (t2 - t0 if ahead else dt)
        for seq in got:
            seq.token_times.append(fetched)
        clock += dt
        done += sum(s.finished for s in got)
        steps.append(StepRecord(clock, dt, len(batch), len(got), parts, fetch_s, sum(program_calls.values()) - calls0,
                                cache_phases.get("dispatch", 0.0) - cache0[0], cache_phases.get("wait", 0.0) - cache0[1]))
        bar.update(done, len(sched.running), len(sched.waiting) + len(pending), clock)
    bar.update(done, 0, 0, clock, force=True)
    bar.close()
    if ahead:
        free_trash(calls.cache, trash)
    calls.cache.drain()
    calls.cache.on_program_call(None)
    calls.cache.check_invariants()
    seqs.sort(key=lambda s: s.job.index)
    return Run(calls.kind, seqs, steps, sched.preemptions, sched.refused_admissions, calls.cache.stats(),
               time.perf_counter() - t_start, phases, compiles.background, compiles.background_s,
               dict(sorted(program_calls.items())), dict(cache_phases), gc_pauses.spent() - gc0[0],
               gc_pauses.full_passes() - gc0[1])


def hold_trash(cache: hc.HiCache) -> tuple[int, int]:
    """(anchor page, SWA page or 0) held from `cache` for the slots past a batch to write."""
    swa = cache.swa_allocator
    got = cache.alloc(1, 1 if swa else 0)
    if got is None:
        raise RuntimeError("no device page is left for the trash page of a step that computes every slot")
    return int(got[cache.anchor][0]), int(got[swa][0]) if swa else 0


def free_trash(cache: hc.HiCache, trash: tuple[int, int]) -> None:
    cache.free(cache.anchor, [trash[0]])
    if cache.swa_allocator:
        cache.free(cache.swa_allocator, [trash[1]])


def warm_up(model, cache: hc.HiCache, max_batch: int, sample_rows: int, every_slot: bool = False) -> None:
    """Compile the batched step on `cache`'s pools and `pick` for this batch size, before
    anything is timed: one step with no slot computed writes nothing (`every_slot`: the step
    that computes every slot, writing a trash page). Its picks are fetched to the host as
    serving fetches them (a GPU's first device-to-host copy sets itself up)."""
    C, M = model.chunk_size, model.max_pages
    trash = hold_trash(cache) if every_slot else (0, 0)
    empty = pack([], max_batch, C, M, trash)
    pools, logits = model.forward_batch(cache.device_pools, empty, every_slot=every_slot)
    for out in pick(logits, np.zeros(sample_rows, np.int32)):
        np.asarray(out)
    cache.set_device_pools(pools)
    if every_slot:
        free_trash(cache, trash)
