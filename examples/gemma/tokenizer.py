"""Gemma's SentencePiece tokenizer, from a GGUF vocabulary (`tokenizer.ggml.*`, model "llama").

Encoding follows llama.cpp's SPM tokenizer, the reference this model is checked against:

1. special pieces (control, user-defined and unknown types: `<start_of_turn>`, runs of
   newlines, HTML tags, ...) are cut out of the text first, longest piece first;
2. in each remaining fragment spaces become U+2581 (Gemma adds no leading space), the
   fragment is split into characters, and adjacent symbols are merged while their
   concatenation is a vocabulary piece, highest score first (leftmost on a tie);
3. a symbol that is not a piece is written as its UTF-8 bytes (`<0xNN>` pieces).

Chat template (Gemma 3; there is no system role: the system text opens the first user turn):

    <bos><start_of_turn>user\\n{system}\\n\\n{message}<end_of_turn>\\n<start_of_turn>model\\n
    {answer}<end_of_turn>\\n<start_of_turn>user\\n{message}<end_of_turn>\\n<start_of_turn>model\\n ...
"""
from __future__ import annotations

import heapq

import numpy as np

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6   # GGUF token types
SPACE = "\u2581"
START_OF_TURN, END_OF_TURN = "<start_of_turn>", "<end_of_turn>"


class Tokenizer:
    def __init__(self, pieces: list[str], scores: np.ndarray, types: np.ndarray, bos: int, eos: int,
                 add_bos: bool = True):
        if not (len(pieces) == len(scores) == len(types)):
            raise ValueError(f"vocabulary arrays differ in length: {len(pieces)} pieces, {len(scores)} scores, "
                             f"{len(types)} types")
        self.pieces, self.scores, self.types = pieces, np.asarray(scores, np.float32), np.asarray(types, np.int32)
        self.bos, self.eos, self.add_bos = bos, eos, add_bos
        self.ids = {p: i for i, p in enumerate(pieces)}
        self._score = self.scores.tolist()
        self._bytes = {int(p[3:5], 16): i for i, p in enumerate(pieces) if self.types[i] == BYTE}
        special = [i for i, t in enumerate(self.types.tolist()) if t in (CONTROL, USER_DEFINED, UNKNOWN) and pieces[i]]
        self._special = sorted(special, key=lambda i: (-len(pieces[i]), i))
        self.end_of_turn = self.ids[END_OF_TURN]

    @classmethod
    def from_gguf(cls, reader) -> "Tokenizer":
        f = reader.fields
        model = f["tokenizer.ggml.model"].contents()
        if model != "llama":
            raise ValueError(f"GGUF tokenizer.ggml.model is {model!r}: only SentencePiece ('llama') is supported")
        tokens = f["tokenizer.ggml.tokens"]
        pieces = [bytes(tokens.parts[i]).decode("utf-8") for i in tokens.data]
        scores = np.concatenate([f["tokenizer.ggml.scores"].parts[i] for i in f["tokenizer.ggml.scores"].data])
        types = np.concatenate([f["tokenizer.ggml.token_type"].parts[i] for i in f["tokenizer.ggml.token_type"].data])
        if f["tokenizer.ggml.add_space_prefix"].contents():
            raise ValueError("GGUF tokenizer.ggml.add_space_prefix is true: not Gemma's tokenizer")
        return cls(pieces, scores, types, int(f["tokenizer.ggml.bos_token_id"].contents()),
                   int(f["tokenizer.ggml.eos_token_id"].contents()),
                   bool(f["tokenizer.ggml.add_bos_token"].contents()))

    # -- encode ---------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; special pieces written in the text are parsed as such."""
        out = [self.bos] if (self.add_bos if add_bos is None else add_bos) else []
        for frag in self._partition(text):
            if isinstance(frag, int):
                out.append(frag)
            else:
                out += self._merge(frag.replace(" ", SPACE))
        return out

    def _partition(self, text: str) -> list[str | int]:
        """Text fragments and special-piece ids, in order; longer special pieces are cut first."""
        frags: list[str | int] = [text] if text else []
        for tid in self._special:
            piece = self.pieces[tid]
            if piece not in text:
                continue
            cut: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or piece not in frag:
                    cut.append(frag)
                    continue
                for j, part in enumerate(frag.split(piece)):
                    if j:
                        cut.append(tid)
                    if part:
                        cut.append(part)
            frags = cut
        return frags

    def _merge(self, text: str) -> list[int]:
        """Score-ordered pair merging over the characters of `text` (one fragment)."""
        sym = list(text)                     # symbol i's text; "" once merged into its left neighbour
        nxt = list(range(1, len(sym))) + [-1]
        prev = list(range(-1, len(sym) - 1))
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            joined = sym[left] + sym[right]
            tid = self.ids.get(joined)
            if tid is not None:
                heapq.heappush(heap, (-self._score[tid], left, right, len(joined)))

        for i in range(len(sym) - 1):
            push(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            # stale: one side was merged since (a merge always grows the left symbol)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[left] >= 0:
                prev[nxt[left]] = left
            push(prev[left], left)
            push(left, nxt[left])
        out = []
        i = 0
        while i >= 0:
            tid = self.ids.get(sym[i])
            if tid is not None:
                out.append(tid)
            else:                            # not a piece: byte fallback
                out += [self._bytes[b] for b in sym[i].encode("utf-8")]
            i = nxt[i]
        return out

    # -- decode ---------------------------------------------------------------------------
    def decode(self, ids, skip_special: bool = True) -> str:
        """Text of `ids`; control pieces are left out when `skip_special`."""
        out = bytearray()
        for i in ids:
            kind, piece = int(self.types[i]), self.pieces[i]
            if kind == BYTE:
                out.append(int(piece[3:5], 16))
            elif not (skip_special and kind in (CONTROL, UNKNOWN)):
                out += piece.replace(SPACE, " ").encode("utf-8")
        return out.decode("utf-8", errors="replace")

    # -- chat template --------------------------------------------------------------------
    def chat(self, system: str, exchanges, message: str) -> list[int]:
        """A conversation's first prompt: BOS, the system text opening the first user turn,
        earlier (user, model) exchanges, the new user message, and the model's cue."""
        text = ""
        for i, (user, model) in enumerate([*exchanges, (message, None)]):
            user = f"{system.strip()}\n\n{user.strip()}" if i == 0 and system else user.strip()
            text += f"{START_OF_TURN}user\n{user}{END_OF_TURN}\n{START_OF_TURN}model\n"
            if model is not None:
                text += f"{model.strip()}{END_OF_TURN}\n"
        return self.encode(text, add_bos=True)

    def next_turn(self, message: str) -> list[int]:
        """What follows the model's answer (its end-of-turn excluded): the next user turn and the cue."""
        return self.encode(f"{END_OF_TURN}\n{START_OF_TURN}user\n{message.strip()}{END_OF_TURN}\n"
                           f"{START_OF_TURN}model\n", add_bos=False)
