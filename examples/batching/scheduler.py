"""`Scheduler`: which sequences run in the next step, and where their pages come from.

Continuous batching over at most `max_batch` slots. Each step, before the model runs:

1. **Grow.** Every running sequence gets the pages its next chunk writes (one `alloc` for
   all of them; pages are taken as a sequence reaches them, not for its whole length up
   front, as vLLM and SGLang do). When the device is full, the most recently admitted
   running sequence is **preempted**: its whole computed pages go to the tree (`retract`,
   where they can be backed up, evicted and loaded back), the rest is freed, and it
   returns to the head of the queue, keeping what it generated. Older sequences are served
   first, so the oldest always progresses (a request never needs more pages than the
   device has: the command line checks it before starting).
2. **Admit.** Requests that arrived wait in a FIFO queue. While slots are free, the head of
   the queue is admitted: its cached prefix is acquired (the candidates of one step in one
   call, `acquire_many`) and its first chunk's pages allocated. With `admission="eager"`
   (the default, vLLM's way) only that first chunk must fit: many sequences run at once,
   and the newest are preempted when the device fills, recomputing what they lose or, with
   a host tier, loading it back. With `admission="reserve"` (SGLang's way) a candidate
   goes in only when the pages the device could grant now (`device_room()`: free, plus
   the tree's pages no lock pins) cover every page it will still allocate to its last
   token beyond what each running sequence will still allocate (a request's output length
   is its `max_tokens`, known on arrival): fewer run at once, and none is preempted. A
   candidate that does not fit gives its prefix back and waits, with every request behind
   it, until a sequence finishes (FIFO: no request overtakes an earlier one).
   `device_room()` does not count the pages in-flight backups will release (`alloc` waits
   for those), so a reservation may wait a step longer than it had to, and eager
   admission learns what fits by asking `alloc`: a refused candidate's `acquire` was done
   for nothing (and may have loaded its prefix back, which then waits on device as a
   device hit).

Once the step is queued, `dispatched` records each sequence's chunk; a chunk that reaches
the last known token expects a token (`Sequence.expect_token`), and a sequence that then
has all its tokens leaves (`insert`: its pages never hold the token still on its way).
`deliver` fills in the tokens once fetched. A loop that schedules the next step before
fetching (`loop.serve`'s `ahead`) admits no sequence whose token is still pending: with
FIFO order, admission stops there for the step. No policy looks at the trace's future.
"""
from __future__ import annotations

import collections
import itertools

from examples.batching.modes import CacheCalls
from examples.batching.sequence import Sequence
from examples.batching.workload import Job

ADMISSIONS = ("eager", "reserve")     # what must fit for a request to be admitted (module docstring)


class Scheduler:
    """The waiting queue and the running batch of one replay (module docstring)."""

    def __init__(self, calls: CacheCalls, chunk_size: int, max_batch: int, admission: str = "eager"):
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, got {admission!r}")
        self.calls, self.chunk, self.max_batch, self.admission = calls, chunk_size, max_batch, admission
        self.page = calls.page_size
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []       # admission order: oldest first
        self.preemptions = 0
        self.refused_admissions = 0             # candidates acquired, then short of pages
        self._blocked = False                   # the queue head did not fit, and no sequence finished since

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def arrive(self, job: Job) -> Sequence:
        seq = Sequence(job)
        self.waiting.append(seq)
        return seq

    def schedule(self) -> list[Sequence]:
        """Grow, then admit (module docstring); the sequences of the next step, oldest first."""
        self._grow()
        self._admit()
        return list(self.running)

    def dispatched(self, batch: list[Sequence]) -> list[tuple[int, Sequence]]:
        """The step computing `batch` is queued: sequence i computed its chunk; those that
        reached their last known token expect a token; the finished ones leave. Returns
        (slot, sequence) of each expected token, for `deliver`."""
        got = []
        for i, seq in enumerate(batch):
            if seq.advance(self.chunk):
                seq.expect_token()
                got.append((i, seq))
        for seq in [s for s in batch if s.finished]:
            self.running.remove(seq)
            self.calls.release(seq)
            self._blocked = False
        return got

    @staticmethod
    def deliver(got: list[tuple[int, Sequence]], tokens, digests, logits: dict | None) -> list[Sequence]:
        """The expected tokens arrived: the sequence of slot i gets tokens[i] (with
        digests[i], and logits[i], f32[vocab], when `logits` has it). Returns the sequences."""
        for i, seq in got:
            seq.set_token(tokens[i], digests[i], None if logits is None else logits.get(i))
        return [seq for _, seq in got]

    # -- internals -------------------------------------------------------------------------------
    def _grow(self) -> None:
        needs = [(s, s.pages_for_next_chunk(self.chunk, self.page)) for s in self.running]
        needs = [(s, n) for s, n in needs if n]
        total = sum(n for _, n in needs)
        if not total:
            return
        grant = self.calls.alloc(total)
        if grant is not None:                   # the usual case: one call for the whole step
            anchor, swa = grant
            for s, n in needs:
                self.calls.grow(s, (anchor[:n], swa[:n]))
                anchor, swa = anchor[n:], swa[n:]
            return
        for s, n in needs:                      # oldest first; preempt from the newest
            while s.placement is not None:
                grant = self.calls.alloc(n)
                if grant is not None:
                    self.calls.grow(s, grant)
                    break
                self._preempt(self.running[-1])

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.calls.release(seq)
        self.waiting.appendleft(seq)            # ahead of later arrivals: it came before them
        self.preemptions += 1                   # (its pages went to the sequence that grew: still blocked)

    def _admit(self) -> None:
        free = self.max_batch - len(self.running)
        if free <= 0 or not self.waiting or (self._blocked and self.running):
            return
        candidates = list(itertools.takewhile(lambda s: not s.pending, list(self.waiting)[:free]))
        if not candidates:                      # the head's token is on its way (module docstring)
            return
        prefixes = self.calls.acquire([s.token_ids() for s in candidates])
        spare = self._spare()
        for k, (seq, prefix) in enumerate(zip(candidates, prefixes, strict=True)):
            start = 0 if prefix is None else prefix.length          # whole pages, short of the last token
            pages = -(-min(seq.known, start + self.chunk) // self.page) - start // self.page
            need = seq.job.pages(self.page) - start // self.page     # all it will allocate
            grant = self._grant(pages, need, spare)
            last = grant is None                 # the later candidates' pinned prefixes may be in the way:
            if last:                             # give them back, try once more, admit no more this step
                for p in prefixes[k + 1:]:
                    self.calls.refuse(p)
                grant = self._grant(pages, need, self._spare())
            if grant is None:
                self.calls.refuse(prefix)
                self.refused_admissions += 1
                if not self.running:
                    raise RuntimeError(f"bug: request {seq.job.index} cannot get {pages} pages on an idle device")
                self._blocked = True
                return
            self.waiting.popleft()
            self.calls.place(seq, prefix, grant)
            self.running.append(seq)
            if spare is not None:
                spare -= need
            if last:
                return

    def _spare(self) -> int | None:
        """Pages the device could grant now beyond what running sequences will still
        allocate (None: eager admission, which does not reserve)."""
        if self.admission == "eager":
            return None
        owed = sum(s.job.pages(self.page) - len(s.placement.anchor) for s in self.running)
        return self.calls.room() - owed

    def _grant(self, pages: int, need: int, spare: int | None):
        """`pages` for a candidate's first chunk, when its `need` fits the reservation (an idle
        device takes any request: the command line checked that one fits)."""
        if spare is not None and need > spare and self.running:
            return None
        return self.calls.alloc(pages)
