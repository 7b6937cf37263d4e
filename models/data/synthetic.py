"""Synthetic parallel data whose correct output is known: for tests and smoke runs.

`copy` repeats the source; `swap` exchanges neighbouring word pairs (a
short-range reordering that a wait-1 policy cannot do without lagging).
Words are drawn from a small vocabulary of made-up German-looking words.
"""
from __future__ import annotations

import random
from pathlib import Path

from models.data import vocab
from models.tokenizer import Tokenizer

WORDS = ["haus", "baum", "wald", "stein", "licht", "wasser", "feuer", "berg", "fluss", "stadt",
         "land", "meer", "wind", "erde", "sonne", "mond"]


def make_target(words: list[str], task: str) -> list[str]:
    if task == "copy":
        return list(words)
    if task == "swap":
        out = list(words)
        for i in range(0, len(out) - 1, 2):
            out[i], out[i + 1] = out[i + 1], out[i]
        return out
    raise ValueError(f"unknown synthetic task {task!r}")


def make_pairs(n: int, task: str = "copy", min_len: int = 2, max_len: int = 8,
               seed: int = 0, vocab: list[str] = WORDS) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        src = [rng.choice(vocab) for _ in range(rng.randint(min_len, max_len))]
        pairs.append((" ".join(src), " ".join(make_target(src, task))))
    return pairs


def make_tokenizer(directory: str | Path, kind: str = "word", vocab_size: int | None = None,
                   pairs: list[tuple[str, str]] | None = None) -> Tokenizer:
    """`word`: one piece per word (subword delays equal word delays); `unigram`:
    words split into several pieces (exercises word/subword bookkeeping)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    text = directory / "spm_train.txt"
    pairs = pairs or make_pairs(2000, seed=123)
    text.write_text("\n".join(x for p in pairs for x in p) + "\n")
    if vocab_size is None:
        vocab_size = len(WORDS) + 5 if kind == "word" else 40
    path = vocab.train([text], directory / f"spm_{kind}", vocab_size, model_type=kind,
                       hard_vocab_limit=False)
    return Tokenizer(path)
