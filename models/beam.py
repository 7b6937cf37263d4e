"""Beam search for offline streams, run once the whole source is encoded.

The result is queued on the stream and written one token per step, so an
offline stream still goes through the same step loop as every other policy.
"""
from __future__ import annotations

import torch

from models.decode_io import DecodeInput


def beam_search(decoder, s, beam: int, max_len: int, length_penalty: float = 1.0) -> list[int]:
    model, cfg, dev = decoder.net, decoder.cfg, decoder.device
    slot = torch.tensor([s.slot], device=dev)
    cross = [(k.expand(beam, -1, -1, -1), v.expand(beam, -1, -1, -1))
             for k, v in decoder.pool.gather_kv("cross", slot, s.available, lone=s.slot)]
    h, dk = cfg.n_heads, cfg.head_dim
    caches = [(torch.zeros(beam, h, max_len + 1, dk, device=dev), torch.zeros(beam, h, max_len + 1, dk, device=dev))
              for _ in range(cfg.decoder_layers)]
    masks = [mk.expand(beam, -1, -1, -1)
             for mk in decoder.pool.gather("cross_mk", slot, s.available, lone=s.slot)] or None
    contexts = (torch.zeros(beam, cfg.decoder_layers, cfg.d_model, device=dev)
                if cfg.variant.carries_context else None)  # SACT's c̃ / interleaved x_{t−1} per hypothesis
    avail = torch.full((beam,), s.available, device=dev)
    finished = torch.ones(beam, dtype=torch.bool, device=dev)
    hyps = [[] for _ in range(beam)]
    scores = torch.zeros(beam, device=dev)
    scores[1:] = float("-inf")  # all beams start identical: expand only the first
    done: list[tuple[float, list[int]]] = []
    prev = torch.full((beam,), cfg.bos_id, device=dev)
    for t in range(max_len):
        tt = torch.full((beam,), t, device=dev)
        out = model.decode_step(DecodeInput(prev, tt, [(k[:, :, : t + 1], v[:, :, : t + 1]) for k, v in caches],
                                            cross, avail, finished, mask_caches=masks, contexts=contexts))
        hidden, new_kv = out.hidden, out.new_kv
        for (k, v), (nk, nv) in zip(caches, new_kv):
            k[:, :, t] = nk[:, :, 0]
            v[:, :, t] = nv[:, :, 0]
        logp = torch.log_softmax(decoder.scores(hidden).float(), -1)
        if t == max_len - 1:  # out of room: only EOS may follow
            eos_only = torch.full_like(logp, float("-inf"))
            eos_only[:, cfg.eos_id] = logp[:, cfg.eos_id]
            logp = eos_only
        cand = (scores.view(-1, 1) + logp).view(-1)
        top, idx = cand.topk(2 * beam)
        new_hyps, new_scores, order, tokens = [], [], [], []
        for score, i in zip(top.tolist(), idx.tolist()):
            b, tok = divmod(i, logp.shape[1])
            if score == float("-inf"):
                break
            if tok == cfg.eos_id:
                seq = hyps[b] + [tok]
                done.append((score / (len(seq) ** length_penalty), seq))
            elif len(new_hyps) < beam:
                new_hyps.append(hyps[b] + [tok])
                new_scores.append(score)
                order.append(b)
                tokens.append(tok)
            if len(new_hyps) == beam and len(done) >= beam:
                break
        best_open = max(new_scores) / ((t + 2) ** length_penalty) if new_scores else float("-inf")
        if not new_hyps or (len(done) >= beam and max(d[0] for d in done) >= best_open):
            break
        while len(new_hyps) < beam:  # keep tensor shapes fixed: pad with dead copies
            new_hyps.append(new_hyps[0])
            new_scores.append(float("-inf"))
            order.append(order[0])
            tokens.append(tokens[0])
        sel = torch.tensor(order, device=dev)
        caches = [(k.index_select(0, sel), v.index_select(0, sel)) for k, v in caches]
        if contexts is not None:
            contexts = out.context.index_select(0, sel)
        hyps, scores = new_hyps, torch.tensor(new_scores, device=dev)
        prev = torch.tensor(tokens, device=dev)
    if not done:
        return hyps[0] + [cfg.eos_id]
    return max(done, key=lambda d: d[0])[1]
