"""The chat example with the real Gemma 3 270M: host hits restore prefixes with both window
pages, and every token and logit equals a full recompute. Needs the `[gemma]` extra
(setup.sh installs it); without it these tests fail, they do not skip."""
import json

import pytest

from examples import chat
from examples.gemma.weights import PACKAGE_HINT


def gguf_path():
    try:
        from examples.gemma.weights import find_gguf
        import gguf  # noqa: F401
        return find_gguf()
    except (ImportError, FileNotFoundError) as e:
        pytest.fail(f"the Gemma example needs the [gemma] extra ({PACKAGE_HINT}): {e}")


@pytest.mark.slow
def test_chat_is_bit_identical_with_host_hits(capsys, tmp_path):
    metrics = tmp_path / "metrics.prom"
    code = chat.main(["--gguf", str(gguf_path()), "--gen-tokens", "8", "--metrics-out", str(metrics)])
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["identical"] is True and code == 0
    # turns 2 and 3 find the shared system pages on device and their own third page on the host
    assert result["host_hit_tokens"] >= 2 * 256 and result["device_hit_tokens"] >= 3 * 512
    assert result["recomputed_tokens"] < result["no_cache_computed_tokens"]
    assert len(result["ttft_ms_cache"]) == len(result["ttft_ms_recompute"]) == 4
    assert any(line.startswith("  model: ") and len(line) > 12 for line in out)   # the model said something
    assert 'hicache_load_back_bytes_total{pool="gemma3_swa_kv"}' in metrics.read_text()


@pytest.mark.slow
def test_tokenizer_matches_llama_cpp_on_the_real_vocabulary():
    """Ids recorded from llama.cpp's tokenizer on the same GGUF file (see BENCHMARKS.md)."""
    from examples.gemma.tokenizer import Tokenizer
    from examples.gemma.weights import read_gguf
    tok = Tokenizer.from_gguf(read_gguf(gguf_path()))      # the reader the chat test opened
    assert tok.encode("Hello world") == [2, 9259, 1902]
    assert tok.encode("def f(x):\n    return x * 2\n") == [2, 2063, 517, 236769, 236781, 1473, 107, 140, 2060, 1123,
                                                         808, 236743, 236778, 107]
    assert tok.encode("<start_of_turn>user\nHi<end_of_turn>\n") == [2, 105, 2364, 107, 10979, 106, 107]
    assert tok.encode("naïve café 日本語 🙂") == [2, 1789, 238527, 560, 33443, 33375, 238582, 57235]
    assert tok.decode(tok.encode("naïve café 日本語 🙂")) == "naïve café 日本語 🙂"


def test_flags_are_checked_before_any_work(capsys):
    for argv, message in ((["--users", "0"], "--users must be in 1..4"), (["--chunk", "48"], "--chunk must divide"),
                          (["--gguf", "/nonexistent.gguf"], "--gguf /nonexistent.gguf: no such file")):
        with pytest.raises(SystemExit) as e:
            chat.main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
