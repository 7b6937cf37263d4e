"""SentencePiece joint vocabulary and word <-> subword bookkeeping.

Source words are encoded one at a time as they arrive (SentencePiece never lets
a piece cross whitespace, so this equals encoding the sentence). Target pieces
are grouped into words: a word is complete when the next piece starts a new
word ("▁", or anything after <unk>, which SentencePiece writes as " ⁇ ") or the
sentence ends.
"""
from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

WORD_START = "\u2581"  # ▁
WORD_MEMO = 100_000     # decoded target words kept (Tokenizer.decode_word): a few MB


def squeeze(text: str) -> str:
    """Text as the no-stutter rule compares it (models/decoding.py): lower case, a word-start mark a
    space, every run of whitespace one space (kept, so "da auf" does not hold "a a")."""
    text = text.replace(WORD_START, " ").lower()
    return (" " if text[:1].isspace() else "") + " ".join(text.split()) + (" " if text[-1:].isspace() else "")


class Tokenizer:
    def __init__(self, model: str | Path | bytes):
        self.sp = spm.SentencePieceProcessor()
        if isinstance(model, bytes):
            self.sp.LoadFromSerializedProto(model)
            self.proto = model
        else:
            self.proto = Path(model).read_bytes()
            self.sp.LoadFromSerializedProto(self.proto)
        n = self.sp.get_piece_size()
        self.word_start = [self.sp.id_to_piece(i).startswith(WORD_START) or self.sp.is_control(i)
                           or self.sp.is_unknown(i) for i in range(n)]
        self.unk_id = self.sp.unk_id()
        self._words: dict[tuple[int, ...], str] = {}
        # each piece's text as the no-stutter rule compares it (models/decoding.py: squeeze)
        self.piece_text = ["" if self.sp.is_control(i) else squeeze(self.sp.id_to_piece(i)) for i in range(n)]
        # pieces without a letter or digit (",", "-", "'"): a run starting with one is not inside a word
        self.no_word_chars = [not any(ch.isalnum() for ch in t) for t in self.piece_text]

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    @property
    def special_ids(self) -> dict[str, int]:
        return {"pad_id": self.sp.pad_id(), "unk_id": self.sp.unk_id(),
                "bos_id": self.sp.bos_id(), "eos_id": self.sp.eos_id()}

    def encode_word(self, word: str) -> list[int]:
        return self.sp.encode(word)

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(list(ids))

    def decode_word(self, ids: list[int]) -> str:
        """One target word's pieces as text, stripped (= decode(ids).strip()), remembered: a word is decoded
        the moment it is complete, on the thread that steps every stream, and words recur (10,150 distinct
        among the 50,737 of the everyday test references). 1.44 us a word through SentencePiece's wrapper,
        0.15 from memory on the 2-core EPYC; too little to show in a server's
        figures there. The memory is bounded: it starts afresh at WORD_MEMO words."""
        key = tuple(ids)
        text = self._words.get(key)
        if text is None:
            if len(self._words) >= WORD_MEMO:
                self._words = {}
            text = self._words[key] = self.sp.decode(list(ids)).strip()
        return text

    def starts_word(self, token: int, previous: int | None = None) -> bool:
        """Whether `token`, written after `previous`, begins a new target word. SentencePiece writes
        <unk> as " ⁇ ", a word of its own: it starts one, and so does whatever follows it."""
        return self.word_start[token] or previous == self.unk_id
