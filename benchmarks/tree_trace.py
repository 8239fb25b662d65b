"""The prefix-sharing trace the tree benchmarks run on (`bench_tree.py`, `tree_ab.py`,
`peer_tree.py`): seeded, so the repository alone reproduces their numbers.

Every prompt is `prompt_tokens` tokens long (a whole number of pages). A prompt is either
*fresh*, all new tokens (the first one, and each later one with probability
`fresh_share`), or a *continuation*: it copies the first k pages of an earlier prompt,
picked uniformly among all before it, and goes on with new tokens. k is drawn uniformly
from [3/4 of the pages, all pages - 1], so shared paths are long and every continuation
splits a node near its end, which is where a radix tree does the most work:

    earlier  |==========================|.......|
    new      |==========================|+++++++|     k pages copied, then new tokens

New tokens come from one running counter folded into 1..`vocab` (id 0 never occurs), so
two prompts share a page only where one copied it from the other. With the defaults,
70,000 prompts give a radix tree of about 95,000 nodes, and take 2.1 GiB as i32 arrays.

    from tree_trace import make_trace
    prompts = make_trace(70_000)                     # list of i32[8192], seed 0
    python benchmarks/tree_trace.py --prompts 1000   # print what a trace looks like
"""
from __future__ import annotations

import argparse

import numpy as np

SHARE_FLOOR = 0.75      # a continuation copies at least this fraction of a prompt's pages


def make_trace(num_prompts: int, prompt_tokens: int = 8192, page: int = 256, seed: int = 0,
               fresh_share: float = 0.02, vocab: int = 100_000) -> list[np.ndarray]:
    """`num_prompts` prompts (i32[prompt_tokens] each) of the trace described above."""
    if prompt_tokens % page or prompt_tokens < 2 * page:
        raise ValueError(f"prompt_tokens must be a multiple of page of at least 2 pages, got {prompt_tokens}, {page}")
    rng = np.random.default_rng(seed)
    pages = prompt_tokens // page
    fresh = rng.random(num_prompts) < fresh_share
    fresh[0] = True
    # for prompt i: an earlier prompt (uniform over 0..i-1) and the pages copied from it
    source = np.floor(rng.random(num_prompts) * np.arange(num_prompts)).astype(np.int64)
    copied = rng.integers(int(pages * SHARE_FLOOR), pages, size=num_prompts) * page
    counter = 0
    prompts: list[np.ndarray] = []
    for i in range(num_prompts):
        keep = 0 if fresh[i] else int(copied[i])
        prompt = np.empty(prompt_tokens, np.int32)
        if keep:
            prompt[:keep] = prompts[source[i]][:keep]
        new = prompt_tokens - keep
        prompt[keep:] = np.arange(counter, counter + new) % vocab + 1
        counter += new
        prompts.append(prompt)
    return prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=1000, help="prompts to draw")
    ap.add_argument("--prompt-tokens", type=int, default=8192, help="tokens per prompt, a multiple of --page")
    ap.add_argument("--page", type=int, default=256, help="tokens per page")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draw")
    args = ap.parse_args()
    prompts = make_trace(args.prompts, args.prompt_tokens, args.page, args.seed)
    shared = [shared_pages(a, b, args.page) for a, b in zip(prompts[1:], prompts[:-1])]
    print(f"{len(prompts)} prompts of {args.prompt_tokens} tokens (seed {args.seed}); first tokens of the first "
          f"three: {[p[:3].tolist() for p in prompts[:3]]}; consecutive prompts share {np.mean(shared):.1f} pages "
          f"on average")


def shared_pages(a: np.ndarray, b: np.ndarray, page: int) -> int:
    """Leading whole pages `a` and `b` have in common."""
    differ = np.flatnonzero(a != b)
    return (int(differ[0]) if differ.size else len(a)) // page


if __name__ == "__main__":
    main()
