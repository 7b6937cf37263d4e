"""Parallel text -> token id tensors -> batches by token count."""
from __future__ import annotations

import random
from pathlib import Path

import torch

from models.data.prepare import TEST_ONLY
from models.errors import UserError
from models.tokenizer import Tokenizer


def read_parallel(prefix: str | Path, src_lang: str, tgt_lang: str) -> list[tuple[str, str]]:
    """`prefix`.src_lang and `prefix`.tgt_lang, aligned by line."""
    src = Path(f"{prefix}.{src_lang}").read_text(encoding="utf-8").splitlines()
    tgt = Path(f"{prefix}.{tgt_lang}").read_text(encoding="utf-8").splitlines()
    if len(src) != len(tgt):
        raise UserError(f"{prefix}: {len(src)} {src_lang} lines but {len(tgt)} {tgt_lang} lines")
    return list(zip(src, tgt))


def oversampled(data: str | Path, weights: dict, src_lang: str, tgt_lang: str) -> list[tuple[str, str]]:
    """Extra copies of small sources: {source: n} adds n - 1 more copies of
    DATA/train.SOURCE (written by prepare-data), so n = 1 changes nothing."""
    extra = []
    for source, n in sorted((weights or {}).items()):
        if not isinstance(n, int) or n < 1:
            raise UserError(f"oversample: {source} must be a whole number >= 1, not {n!r}")
        if source in TEST_ONLY or source == "unseen":
            raise UserError(f"oversample: '{source}' is held out for the unseen test set and never trained on")
        prefix = Path(data) / f"train.{source}"
        if not Path(f"{prefix}.{src_lang}").is_file():
            raise UserError(f"oversample: no {prefix}.{src_lang}; is '{source}' one of the sources "
                            f"prepare-data wrote to {data}?")
        extra += read_parallel(prefix, src_lang, tgt_lang) * (n - 1)
    return extra


def encode_pairs(pairs, tok: Tokenizer, max_positions: int) -> list[tuple[list[int], list[int]]]:
    """Source gets EOS appended (it is a source position); target is kept bare.
    Pairs that do not fit the model's positions are dropped."""
    eos = tok.special_ids["eos_id"]
    src = tok.sp.encode([p[0] for p in pairs])
    tgt = tok.sp.encode([p[1] for p in pairs])
    out = []
    for s, t in zip(src, tgt):
        if s and t and len(s) + 1 <= max_positions and len(t) + 1 <= max_positions:
            out.append((s + [eos], t))
    return out


def make_batches(examples, max_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices grouped so that batch_size * longest sequence <= max_tokens, in shuffled order."""
    rng = random.Random(seed * 100003 + epoch)
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), rng.random()))
    batches, cur, longest = [], [], 0
    for i in order:
        n = max(len(examples[i][0]), len(examples[i][1]) + 1)
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(examples, idx: list[int], pad: int, bos: int, eos: int, device=None):
    """-> src (B,S), src_len (B,), tgt_in (B,T) = BOS + y, tgt_out (B,T) = y + EOS."""
    b = len(idx)
    s_len = max(len(examples[i][0]) for i in idx)
    t_len = max(len(examples[i][1]) for i in idx) + 1
    src = torch.full((b, s_len), pad, dtype=torch.long)
    tgt_in = torch.full((b, t_len), pad, dtype=torch.long)
    tgt_out = torch.full((b, t_len), pad, dtype=torch.long)
    lens = torch.zeros(b, dtype=torch.long)
    for r, i in enumerate(idx):
        s, t = examples[i]
        src[r, : len(s)] = torch.tensor(s)
        lens[r] = len(s)
        tgt_in[r, : len(t) + 1] = torch.tensor([bos] + t)
        tgt_out[r, : len(t) + 1] = torch.tensor(t + [eos])
    return tuple(x.to(device) for x in (src, lens, tgt_in, tgt_out))
