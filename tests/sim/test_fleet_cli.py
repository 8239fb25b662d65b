"""`python -m hicache_jax.sim`: no jax, its JSON line, sweeps and plots, and one clear line for bad input."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from hicache_jax.sim.cli import main
from sim_helpers import TRACE

FLEET = ["--trace", str(TRACE), "--config", "configs/deepseek_v4_flash.json", "--limit", "150",
         "--max-input-tokens", "8192", "--device-tokens", "64k", "--instances", "2"]
BASE = FLEET + ["--host-tokens", "256k"]


def run(capsys, *extra) -> dict:
    assert main(BASE + list(extra)) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_the_command_imports_no_jax_and_ends_with_its_json_line():
    code = ("import sys, runpy\n"
            f"sys.argv = ['hicache_jax.sim'] + {BASE + ['--storage-tokens', '1M', '--quiet']!r}\n"
            "try:\n    runpy.run_module('hicache_jax.sim', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "assert not [m for m in sys.modules if m == 'jax' or m.startswith('jax.')], 'jax was imported'\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("requests", "instances", "hit_rate", "bytes_moved", "ttft_ms", "prefill_tokens_saved"):
        assert key in out
    assert (out["requests"], out["instances"]) == (150, 2)
    assert set(out["hit_rate"]) == {"device", "host", "storage", "total"}
    assert set(out["ttft_ms"]) >= {"p50", "p90", "p99"}
    assert set(out["bytes_moved"]) == {"device_to_host", "host_to_device", "host_to_storage", "storage_to_host"}
    assert out["prefill_tokens_saved"] == sum(out["hit_tokens"].values())
    assert out["hit_rate"]["total"] == pytest.approx(sum(out["hit_rate"][t] for t in ("device", "host", "storage")),
                                                      abs=1e-5)


def test_progress_and_summary_unless_quiet(capsys):
    out = run(capsys)
    assert out["tiers"]["device_pages"] == {"kv": 250, "swa": 62}
    main(BASE)
    captured = capsys.readouterr()
    assert "150 / 150 requests" in captured.err and "hit rate" in captured.out
    main(BASE + ["--quiet"])
    captured = capsys.readouterr()
    assert captured.err == "" and len(captured.out.strip().splitlines()) == 1


def test_gib_and_token_forms_of_a_size_agree(capsys):
    assert main(FLEET + ["--host-gib", "2", "--quiet"]) == 0
    a = json.loads(capsys.readouterr().out)
    b = run(capsys, "--host-tokens", "2GiB", "--quiet")
    assert a["tiers"]["host_pages"] == b["tiers"]["host_pages"] == {"kv": 706, "swa": 176}
    assert a["hit_rate"] == b["hit_rate"]


def test_a_sweep_prints_a_table_and_draws_its_plot(capsys, tmp_path):
    png = tmp_path / "sweep.png"
    # --host-gib given, the sweep names --host-tokens: the swept flag replaces the other form
    assert main(FLEET + ["--host-gib", "1", "--sweep", "host-tokens=0,256k,1M", "--plot", str(png)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = json.loads(out[-1])
    runs = last["sweep"]["runs"]
    assert last["sweep"]["flag"] == "host-tokens" and [r["value"] for r in runs] == ["0", "256k", "1M"]
    assert [r["tiers"]["host_pages"]["kv"] for r in runs] == [0, 1000, 3906]
    totals = [r["hit_rate"]["total"] for r in runs]
    assert totals == sorted(totals)
    head = next(i for i, line in enumerate(out) if line.split()[:2] == ["host-tokens", "total"])
    assert "TTFT p50" in out[head] and [line.split()[0] for line in out[head + 2:head + 5]] == ["0", "256k", "1M"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sweep_of_any_flag(capsys):
    out = run(capsys, "--sweep", "route=random,affinity", "--quiet")
    assert [r["value"] for r in out["sweep"]["runs"]] == ["random", "affinity"] and out["route"] == "affinity"


@pytest.mark.parametrize("extra, says", [
    (["--device-tokens", "4k"], "--device-tokens 4k"),
    (["--device-tokens", "4M", "--window-ratio", "0.001"], "--window-ratio"),
    (["--host-tokens", "lots"], "'lots'"),
    (["--route", "nearest"], "'nearest'"),
    (["--window-policy", "ends+every_0"], "--window-policy"),
    (["--instances", "0"], "--instances must be >= 1, got 0"),
    (["--prefill-tokens-per-s", "0"], "--prefill-tokens-per-s"),
    (["--sweep", "colour=1,2"], "--sweep 'colour=1,2'"),
    (["--sweep", "host-tokens"], "--sweep 'host-tokens'"),
    (["--sweep", "host-tokens=1M,oops"], "'oops'"),
    (["--plot", "x.png"], "--plot draws a sweep"),
    (["--config", "configs/nope.json"], "--config configs/nope.json"),
    (["--host-tokens", "0", "--storage-tokens", "1M"], "--storage-tokens 1M needs a host tier"),
])
def test_bad_input_ends_in_one_line_naming_it(capsys, extra, says):
    with pytest.raises(SystemExit) as e:
        main(BASE + extra)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and err[-1].startswith("python -m hicache_jax.sim: error:")


def test_required_sizes_and_a_bad_trace_line(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(FLEET)
    assert "--host-tokens (or --host-gib) is required" in capsys.readouterr().err
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    with pytest.raises(SystemExit):
        main(["--trace", str(bad)] + BASE[2:])
    assert f"{bad}:2: field 'input_length' is missing" in capsys.readouterr().err
