"""The batched loop's scheduler over a page counter: pages taken as sequences grow; eager
admission (the default), where the newest is preempted when the device is full and put back
at the head of the queue; reserving admission, which admits a request only when all its
pages fit beside what the running ones still need, and never preempts; FIFO admission that
waits for a sequence to finish, one `acquire` per step. No model, no jax."""
import numpy as np
import pytest

from examples.batching.modes import CacheCalls, CacheKind
from examples.batching.scheduler import Scheduler
from examples.batching.workload import Job

P = C = 4            # tokens per page and per chunk


class PageCounter:
    """The part of HiCache the no-cache calls use: `alloc` / `free` of anchor pages."""

    anchor, swa_allocator, window_pages = "kv", None, 0

    class layout:
        page_size = P

    def __init__(self, pages: int):
        self.free_pages = list(range(pages))
        self.acquires = 0

    def alloc(self, pages, swa_pages=0):
        if pages > len(self.free_pages):
            return None
        got, self.free_pages = self.free_pages[:pages], self.free_pages[pages:]
        return {"kv": np.asarray(got, np.int32)}

    def device_room(self):
        return {"kv": len(self.free_pages)}

    def free(self, allocator, pages):
        assert not set(pages) & set(self.free_pages), "freed twice"
        self.free_pages += list(pages)


class CountingCalls(CacheCalls):
    def acquire(self, prompts):
        self.cache.acquires += 1
        return super().acquire(prompts)


def jobs(n: int, prompt: int = 8, gen: int = 4) -> list[Job]:
    return [Job(i, 0.0, np.arange(1, prompt + 1, dtype=np.int32), gen) for i in range(n)]


def step(sched: Scheduler) -> list[int]:
    batch = sched.schedule()
    n = len(batch)
    Scheduler.deliver(sched.dispatched(batch), np.full(n, 7), np.zeros(n, np.uint32), None)
    return [s.job.index for s in batch]


def test_the_newest_is_preempted_and_comes_back_first():
    cache = PageCounter(6)
    sched = Scheduler(CountingCalls(CacheKind.NO_CACHE, cache, None), C, max_batch=3, admission="eager")
    for j in jobs(3):
        sched.arrive(j)
    assert step(sched) == [0, 1, 2] and len(cache.free_pages) == 3     # one page each: the first chunk
    assert step(sched) == [0, 1, 2] and len(cache.free_pages) == 0     # prompts done: first tokens
    # every decode needs a third page, none is free: the newest leaves, its 2 pages go to the others
    assert step(sched) == [0, 1] and sched.preemptions == 1
    assert [s.job.index for s in sched.waiting] == [2] and len(sched.waiting[0].tokens) == 1
    assert sched.waiting[0].placement is None and len(cache.free_pages) == 0


def test_admission_is_fifo_and_waits_for_a_sequence_to_finish():
    cache = PageCounter(6)
    sched = Scheduler(CountingCalls(CacheKind.NO_CACHE, cache, None), C, max_batch=3, admission="eager")
    for j in jobs(4, prompt=8, gen=1):
        sched.arrive(j)
    assert step(sched) == [0, 1, 2] and cache.acquires == 1           # one acquire for the three
    assert step(sched) == [0, 1, 2]                                    # all three finish: 6 pages back
    assert sched.running == [] and len(cache.free_pages) == 6
    assert step(sched) == [3] and cache.acquires == 2


def test_a_blocked_queue_head_is_not_asked_again_until_a_sequence_finishes():
    """Two requests of 5 pages on a 5-page device: the newer is preempted whenever the older
    grows; admitted again while a page is free, refused once none is, and then not asked
    again (no `acquire`) until the older one finishes."""
    cache = PageCounter(5)
    sched = Scheduler(CountingCalls(CacheKind.NO_CACHE, cache, None), C, max_batch=4, admission="eager")
    for j in jobs(2, prompt=16, gen=4):
        sched.arrive(j)
    trail = []
    while sched.busy:
        batch = step(sched)
        trail.append((batch, cache.acquires, sched.preemptions))
    assert trail[:8] == [([0, 1], 1, 0), ([0, 1], 1, 0),
                         ([0, 1], 2, 1),     # 1 preempted by 0's third page, admitted again on the free one
                         ([0, 1], 3, 2),     # again
                         ([0], 4, 3),        # preempted, and refused: no page left
                         ([0], 4, 3), ([0], 4, 3),   # blocked: not asked while 0 decodes
                         ([1], 5, 3)]        # 0 finished: 1 is admitted
    assert len(cache.free_pages) == 5


def test_reserving_admission_takes_only_what_can_finish_and_never_preempts():
    """Three requests of 3 pages each (8 prompt + 4 generated tokens) on 6 pages: two are
    admitted, the third waits for them to finish although its first page was free from the
    start, and none is ever preempted (eager admission preempts here: the test above)."""
    cache = PageCounter(6)
    sched = Scheduler(CountingCalls(CacheKind.NO_CACHE, cache, None), C, max_batch=3, admission="reserve")
    for j in jobs(3):
        sched.arrive(j)
    batches = []
    while sched.busy:
        batches.append(step(sched))
    assert batches == [[0, 1]] * 5 + [[2]] * 5      # 2 prefill chunks, then 3 more tokens each
    assert sched.preemptions == 0 and sched.refused_admissions == 1 and cache.acquires == 2
    assert len(cache.free_pages) == 6


def test_an_unknown_admission_is_refused_by_name():
    with pytest.raises(ValueError, match="admission must be one of .*'greedy'"):
        Scheduler(CountingCalls(CacheKind.NO_CACHE, PageCounter(4), None), C, max_batch=2, admission="greedy")


def test_scheduled_ahead_a_preempted_sequence_waits_for_its_token_and_finished_ones_leave_before_theirs():
    """The loop's `ahead` order: step N + 1 is scheduled between `dispatched` (N queued) and
    `deliver` (N's tokens fetched). Three requests on 6 pages, a fourth waiting: the newest is
    preempted while its first token is on the way; it heads the queue and nothing is admitted
    (no `acquire`) until the token arrives. A finished sequence gives its pages back before its
    last token arrives. Every token ends where it belongs."""
    cache = PageCounter(6)
    sched = Scheduler(CountingCalls(CacheKind.NO_CACHE, cache, None), C, max_batch=3, admission="eager")
    seqs = [sched.arrive(j) for j in jobs(4)]
    in_flight, trail = None, []
    while sched.busy or in_flight:
        batch = sched.schedule()
        head = sched.waiting[0] if sched.waiting else None
        trail.append(([s.job.index for s in batch], cache.acquires, head and (head.job.index, head.pending)))
        if in_flight:
            Scheduler.deliver(in_flight, np.arange(3) + 10 * len(trail), np.zeros(3, np.uint32), None)
        in_flight = sched.dispatched(batch) if batch else None
        if any(s.finished for s in batch):          # left before its token arrived: pages back already
            assert all(s not in sched.running and s.pending for s in batch if s.finished)
    assert trail[:3] == [([0, 1, 2], 1, (3, False)), ([0, 1, 2], 1, (3, False)),
                         ([0, 1], 1, (2, True))]    # 2 preempted with its token on the way: not asked
    assert trail[3][1] == 2                         # asked once its token is in
    assert all(len(s.tokens) == 4 and not s.pending and min(s.tokens) >= 10 for s in seqs)
    assert len(cache.free_pages) == 6


@pytest.mark.parametrize("admission", ["eager", "reserve"])
@pytest.mark.parametrize("seed", range(6))
def test_scheduling_ahead_gives_every_request_the_tokens_it_gets_in_turn(seed, admission):
    """Random requests on a small device, served in the loop's two orders (in turn: fetch
    before scheduling again; ahead: schedule, then fetch the step before). A stand-in model
    makes each token from the tokens before it and packing reads every token a chunk
    computes (`ids` raises on a pending one), so both orders must give every request the
    same tokens, and every page comes back."""
    rng = np.random.default_rng(seed)
    spec = [(rng.integers(1, 50, int(rng.integers(1, 20))).astype(np.int32), int(rng.integers(1, 6)))
            for _ in range(12)]

    def serve(ahead: bool) -> list[list[int]]:
        cache = PageCounter(8)
        sched = Scheduler(CacheCalls(CacheKind.NO_CACHE, cache, None), C, max_batch=3, admission=admission)
        seqs = [sched.arrive(Job(i, 0.0, prompt, gen)) for i, (prompt, gen) in enumerate(spec)]
        in_flight = None
        while sched.busy or in_flight:
            batch = sched.schedule()
            if ahead and in_flight:
                Scheduler.deliver(*in_flight, np.zeros(3, np.uint32), None)
                in_flight = None
            for s in batch:                                     # packing
                s.ids(*s.next_chunk(C))
            expected = sched.dispatched(batch)
            made = np.zeros(3, np.int64)
            for i, s in expected:                               # the model: a token from all before it
                made[i] = int((s.ids(0, s.known - 1) * np.arange(1, s.known)).sum()) % 97
            in_flight = (expected, made) if expected else None
            if not ahead and in_flight:
                Scheduler.deliver(*in_flight, np.zeros(3, np.uint32), None)
                in_flight = None
        assert sorted(cache.free_pages) == list(range(8))
        assert all(len(s.tokens) == s.job.gen and not s.pending for s in seqs)
        return [s.tokens for s in seqs]

    assert serve(ahead=True) == serve(ahead=False)
