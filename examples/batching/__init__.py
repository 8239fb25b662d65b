"""A continuous-batching serving loop around `HiCache`, for replaying request traces.

    workload.py   trace requests -> jobs: token ids from hash ids, cuts, arrival times
    sequence.py   one request's state: tokens, timings, the next chunk, its placement
    modes.py      hicache / device_only / no_cache: the caches and the calls each makes
    scheduler.py  admission, page growth, preemption (what runs in the next step)
    slots.py      sequences packed into the model's batched step; greedy tokens out
    loop.py       the replay: a simulated clock, one batched step per iteration
    check.py      identity: a sample recomputed alone, every request across runs
    report.py     summaries, the comparison table, throughput over time
    plot.py       the PNG: TTFT CDFs and throughput over time
    progress.py   a text progress bar on stderr

`examples/serve_trace.py` is the command line. The model side is
`ChunkModel.forward_batch` (examples/tiny_models/base.py).
"""
