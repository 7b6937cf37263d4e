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


def candidate_loss(flat: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor,
                   rows: torch.Tensor | None = None, log_probs: bool = False) -> torch.Tensor:
    """Sum of -log(1 - p(c)) over candidates: `flat` the (N, V) float logits (or, with `log_probs`,
    log-probabilities: a log-softmax the cross-entropy already took), `tokens` and `mask` (K, c) the
    candidates of `rows` (K row indices; None: every row, K = N)."""
    if rows is None:
        logit = flat.gather(1, tokens)
    else:
        logit = flat[rows.unsqueeze(1), tokens]
    if not log_probs:
        # nearly every position has a candidate (repeating the last token), so every row's
        # log-partition is taken, and the candidates' logits are gathered in place
        lse = flat.logsumexp(-1, keepdim=True)
        logit = logit - (lse if rows is None else lse[rows])
    # clamped: a candidate the model is sure of gives a large but finite gradient
    p = logit.exp().clamp(max=1 - 1e-6)
    return (-torch.log1p(-p) * mask).sum()


def unlikelihood_loss(logits: torch.Tensor, tgt_out: torch.Tensor, pad_id: int, n: int,
                      ngram: int = 0, log_probs: bool = False) -> torch.Tensor:
    """Sum over a batch of -log(1 - p(c)) for every candidate c (`repeat_candidates`); logits
    (B, T, V), or (B*T, V) flattened, are the model's scores for `tgt_out` (B, T) under teacher forcing
    (log-probabilities with `log_probs`). Stutters alone are found by `stutter_candidates`; with `ngram`,
    by the per-position search."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    if not ngram:
        tokens, mask = stutter_candidates(tgt_out, pad_id, n)
        return candidate_loss(flat, tokens.reshape(-1, n), mask.reshape(-1, n), log_probs=log_probs)
    positions, tokens = repeat_candidates(tgt_out, pad_id, n, ngram)
    rows = torch.tensor(positions, dtype=torch.long, device=flat.device)
    tokens = torch.tensor(tokens, dtype=torch.long, device=flat.device).view(-1, 1)
    return candidate_loss(flat, tokens, torch.ones_like(tokens, dtype=torch.bool), rows, log_probs)
