"""Unlikelihood on repeats: a training term that lowers the probability the model gives to the
token that would make its translation repeat the run it just wrote ("at eight o'clock at eight
o'clock"), so it stutters less without a decoding rule.

At every target position the candidates are the tokens `models.decoding.stutter_tokens` bans after the
reference prefix (the token m places back, for each run length m <= n whose m-1 tokens before it
repeat) and, when `ngram` is set, those `models.decoding.banned_tokens` bans (they would complete an
n-gram the prefix already holds: a repeat anywhere in the sentence), less the reference's own next
token: a repeat the reference makes ("very very") is never penalised. The term is Welleck et al.'s
token-level unlikelihood, -log(1 - p(candidate)), summed over positions and candidates, and added to the
cross-entropy with a weight (TrainConfig.unlikelihood).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from models.decoding import banned_tokens, stutter_tokens


def repeat_candidates(tgt_out: torch.Tensor, pad_id: int, n: int, ngram: int = 0) -> tuple[list[int], list[int]]:
    """(flat position, token) pairs of a (B, T) batch of reference outputs: the tokens that would
    stutter (runs of up to n) or repeat an `ngram` (0: not counted) at each position, given the
    reference before it, except the reference's own token."""
    positions, tokens = [], []
    width = tgt_out.shape[1]
    for b, row in enumerate(tgt_out.tolist()):
        for t, gold in enumerate(row):
            if gold == pad_id:
                break
            bans = set(stutter_tokens(row[:t], n))
            if ngram:
                bans.update(banned_tokens(row[:t], ngram))
            for tok in sorted(bans):
                if tok != gold:
                    positions.append(b * width + t)
                    tokens.append(tok)
    return positions, tokens


def stutter_candidates(tgt_out: torch.Tensor, pad_id: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`repeat_candidates` without n-grams, as tensors on tgt_out's device: (B, T, n) tokens and a mask of
    the real candidates, one slot per run length m (the token m places back), each token once per
    position. A few dozen element-wise operations on the batch's device instead of a Python loop over
    every position, which on a GPU also waits each step for the batch to reach the host."""
    b, t = tgt_out.shape
    alive = (tgt_out != pad_id).long().cumprod(1).bool()   # the positions before the first pad
    pos = torch.arange(t, device=tgt_out.device)

    def back(s: int) -> torch.Tensor:   # tgt_out[:, t - s] at position t (anything where t < s)
        return torch.cat([tgt_out.new_full((b, s), pad_id), tgt_out[:, :t - s]], 1) if s < t else \
            tgt_out.new_full((b, t), pad_id)

    tokens, masks = [], []
    for m in range(1, n + 1):
        ok = alive & (pos >= 2 * m - 1)
        for i in range(1, m):           # the m - 1 tokens before t repeat the m - 1 before them
            ok = ok & (back(i) == back(i + m))
        tok = back(m)
        ok = ok & (tok != tgt_out)      # never the reference's own next token
        for earlier, earlier_ok in zip(tokens, masks):
            ok = ok & ~(earlier_ok & (earlier == tok))
        tokens.append(tok)
        masks.append(ok)
    return torch.stack(tokens, -1), torch.stack(masks, -1)


def unlikelihood_loss(logits: torch.Tensor, tgt_out: torch.Tensor, pad_id: int, n: int,
                      ngram: int = 0) -> torch.Tensor:
    """Sum over a batch of -log(1 - p(c)) for every candidate c (`repeat_candidates`); logits
    (B, T, V), or (B*T, V) flattened, are the model's scores for `tgt_out` (B, T) under teacher forcing."""
    flat = logits.reshape(-1, logits.shape[-1])
    if ngram:   # n-gram repeats: the Python search (off by default)
        positions, tokens = repeat_candidates(tgt_out, pad_id, n, ngram)
        if not positions:
            return logits.new_zeros((), dtype=torch.float32)
        rows = flat[torch.tensor(positions, device=logits.device)].float()
        p = F.softmax(rows, -1).gather(1, torch.tensor(tokens, device=logits.device).view(-1, 1))
        mask = None
    else:
        tokens, mask = stutter_candidates(tgt_out, pad_id, n)
        # nearly every position has one (repeating the last token), so every row's log-partition is
        # taken, with no index copy and no wait for the host
        flat = flat.float()
        p = (flat.gather(1, tokens.reshape(-1, n)) - flat.logsumexp(-1, keepdim=True)).exp()
        mask = mask.reshape(-1, n)
    # clamped: a candidate the model is sure of gives a large but finite gradient
    terms = -torch.log1p(-p.clamp(max=1 - 1e-6))
    return (terms if mask is None else terms * mask).sum()
