"""Identity: a sample of requests recomputed alone, and every request across the runs.

Alone means: the request's whole token history (prompt, then the tokens it generated)
computed from position 0 on pools nothing else uses, through the same batched program
as the runs with only slot 0 in the batch (the others on a trash page when it computes
every slot), chunk by chunk, decode growing `valid` by one, logical page q
on device page q. Every generated token and every logits row behind it must equal, bit
for bit, what each run produced for that request, wherever its prefix came from there
(device, host, recomputed after a preemption) and whatever it was batched with. All
requests are also compared across the runs: tokens, and the digest of each logits row
(`slots.pick`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from examples.batching.loop import Run
from examples.batching.sequence import Placement, Sequence
from examples.batching.slots import pack, pick
from examples.batching.workload import Job


@dataclasses.dataclass(frozen=True)
class CheckResult:
    sample: tuple[int, ...]               # job indices recomputed alone
    identical_sample: bool                # every run equals the alone recompute on the sample
    identical_across_runs: bool           # tokens and logits digests equal across runs, every request
    mismatches: tuple[str, ...]           # what differed, one line each

    @property
    def identical(self) -> bool:
        return self.identical_sample and self.identical_across_runs


def sample_indices(jobs: list[Job], n: int) -> frozenset[int]:
    """`n` job indices spread evenly over the replay (first and last included)."""
    if n <= 0 or not jobs:
        return frozenset()
    picks = np.unique(np.linspace(0, len(jobs) - 1, min(n, len(jobs))).round().astype(int))
    return frozenset(jobs[i].index for i in picks)


def recompute_alone(model, pools, job: Job, max_batch: int, sample_rows: int, trash: tuple[int, int] | None = None):
    """(pools, Sequence) of `job` computed alone (module docstring); pools are donated.
    `trash`: the step computes every slot, spare ones on these (anchor, SWA) pages."""
    seq = Sequence(job)
    n = job.pages(model.page_size)
    seq.place(Placement(list(range(n)), {q: q for q in range(n)}, [], 0, None), 0)
    rows = np.zeros(sample_rows, np.int32)
    while not seq.finished:
        slots = pack([seq], max_batch, model.chunk_size, model.max_pages, trash or (0, 0))
        pools, logits = model.forward_batch(pools, slots, every_slot=trash is not None)
        tokens, digests, kept = pick(logits, rows)
        if seq.advance(model.chunk_size):
            seq.expect_token()
            seq.set_token(int(np.asarray(tokens)[0]), int(np.asarray(digests)[0]), np.asarray(kept)[0])
    return pools, seq


def check(model, pools, jobs: list[Job], runs: dict[str, Run], sample: frozenset[int], max_batch: int,
          trash: tuple[int, int] | None = None) -> CheckResult:
    """Recompute `sample` alone on `pools` (zero-filled or not: nothing is read before it is
    written) and compare with every run; compare all requests across runs. `trash`: the
    runs' step computed every slot; spare slots go on these pages of `pools`, past the
    request's own."""
    alone_bad: list[str] = []
    by_index = {name: {s.job.index: s for s in run.sequences} for name, run in runs.items()}
    rows = max(1, min(len(sample), max_batch))
    for job in (j for j in jobs if j.index in sample):
        pools, alone = recompute_alone(model, pools, job, max_batch, rows, trash)
        for name in runs:
            got = by_index[name][job.index]
            if got.tokens != alone.tokens:
                alone_bad.append(f"request {job.index}: {name} tokens differ from the request alone")
            elif len(got.logits) != len(alone.logits) or not all(
                    np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got.logits, alone.logits)):
                alone_bad.append(f"request {job.index}: {name} logits differ from the request alone")
    runs_bad: list[str] = []
    first, *others = list(runs)
    for job in jobs:
        ref = by_index[first][job.index]
        for name in others:
            got = by_index[name][job.index]
            if got.tokens != ref.tokens or got.digests != ref.digests:
                runs_bad.append(f"request {job.index}: {name} differs from {first}")
    return CheckResult(tuple(sorted(sample)), not alone_bad, not runs_bad, tuple(alone_bad + runs_bad))
