"""Two processes share one store: one writes pages and exits, a second one serves them bit-exact."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from storage_helpers import needs_mooncake, start_mooncake

# One process: a StorageTier over `url` writes (or reads back and checks) the pages of a
# seeded prompt, kv and SWA window alike, and prints what it saw as JSON.
SCRIPT = """
import json, sys
import numpy as np
sys.path[:0] = ["tests", "tests/storage"]
from hicache_jax.storage import StorageConfig, StorageTier, open_backend
from storage_helpers import load_layout, random_rows, random_tokens
role, url, name = sys.argv[1:4]
tier = StorageTier(load_layout(name), open_backend(url, timeout_s=30), StorageConfig(call_timeout_s=30, model_id="seed-7"))
pages = tier.page_hashes(random_tokens(6, seed=7))
report = {"usable": tier.usable_prefix(pages)}
for allocator, layout in tier.rows.items():
    rows = random_rows(layout, 6, seed=sorted(tier.rows).index(allocator))
    if role == "write":
        op = tier.put_pages(allocator, pages, rows, range(6))
        op.wait(60)
        report[allocator] = op.result().written
    else:
        out = np.zeros_like(rows)
        op = tier.get_pages(allocator, pages, out, range(6))
        op.wait(60)
        same = all(np.array_equal(out[:, s.offset:s.offset + s.nbytes], rows[:, s.offset:s.offset + s.nbytes])
                   for s in layout.spans)
        report[allocator] = [op.result().served, same]
report["failures"] = tier.stats().failures
tier.close()
print(json.dumps(report))
"""


def run(role, url, name):
    env = {**os.environ, "MC_LOG_LEVEL": "WARNING"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, role, url, name], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def check(url, name):
    wrote = run("write", url, name)
    assert wrote["usable"] == 0 and not wrote["failures"]
    read = run("read", url, name)
    assert read["usable"] == 6 and not read["failures"]     # SWA windows were written with every page
    assert all(v == [6, True] for k, v in read.items() if k not in ("usable", "failures"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_v4", "tiny_gqa"])
def test_tensorstore_directory_shared_by_two_processes(tmp_path, name):
    check(f"file://{tmp_path}/l3", name)


@pytest.mark.slow
@needs_mooncake
def test_mooncake_store_shared_by_two_processes(tmp_path):
    server = start_mooncake(tmp_path)
    try:
        check(server.url, "tiny_v4")
    finally:
        server.stop()
