"""On an NVIDIA GPU: the batched replay of the conversation trace (examples/serve_trace.py),
in turn and scheduled ahead, is bit-identical (sampled requests against themselves alone,
every request across the three runs), compiles nothing while serving and serves host hits
(`pytest -m gpu`; skipped elsewhere). Here a step that computes every slot, spare slots on a
trash page, and the tokens fetched after the next step is scheduled, meet the GPU's
asynchronous dispatch, which a CPU does not have."""
import json

import jax
import pytest

from conftest import CONFIGS, ROOT
from examples import serve_trace

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("config, ahead", [("tiny_v4", True), ("tiny_gqa", True), ("tiny_v41", False)],
                         ids=["tiny_v4-ahead", "tiny_gqa-ahead", "tiny_v41-in_turn"])
def test_the_replay_is_identical_and_compiles_nothing(config, ahead, capsys, tmp_path):
    trace = ROOT / "traces" / "conversation_trace.jsonl.gz"
    argv = ["--trace", str(trace), "--config", str(CONFIGS / f"{config}.json"), "--limit", "40",
            "--max-input-tokens", "2048", "--max-output-tokens", "8", "--max-batch", "8",
            "--time-scale", "0.05", "--plot", str(tmp_path / "replay.png"), "--quiet"]
    code = serve_trace.main(argv + ["--schedule-ahead" if ahead else "--no-schedule-ahead"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["platform"] == "gpu" and result["schedule_ahead"] is ahead
    assert code == 0 and result["identical"] is True and result["compiles_while_serving"] == 0
    assert result["max_batch"] >= 2 and result["hit_tokens"]["host"] > 0
    assert all(run["output_tokens"] == result["runs"]["hicache"]["output_tokens"] for run in result["runs"].values())
