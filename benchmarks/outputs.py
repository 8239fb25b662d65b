"""Where a benchmark writes its results when no `--out` names a path.

`$OUT/<name>` when the environment sets OUT (a run on a lent machine, whose $OUT folder
comes back), else `benchmarks/results/<name>`; a `--smoke` run's go to
`benchmarks/results/smoke/`, which git ignores. Never the repository root.
"""
from __future__ import annotations

import os
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def default_out(name: str, smoke: bool = False) -> pathlib.Path:
    """The default path of the result `name` (a file name, or "" for a results folder)."""
    if os.environ.get("OUT"):
        folder = pathlib.Path(os.environ["OUT"])
    else:
        folder = RESULTS / "smoke" if smoke else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name if name else folder
