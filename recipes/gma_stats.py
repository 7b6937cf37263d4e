"""How far GMA's predicted positions advance per target piece, against what the sentences need.

    python recipes/gma_stats.py [CHECKPOINT] [SOURCE] [N]    # default gma_delta1 data/de-en/test.de 300

Streams the first N sentences of SOURCE (at most 30 words) word by word and prints, per
decoder layer, the mean step Δp_i = p_i - p_{i-1} of the pieces written while the source
was still arriving, beside the rate an evenly advancing alignment would have
((source subwords + EOS) / target pieces), and how much of each translation is left for
after the source ended (the tail a live caption waits for).
"""
from __future__ import annotations

import statistics
import sys


def main(checkpoint: str = "gma_delta1", source: str = "data/de-en/test.de", n: int = 300) -> None:
    import torch

    from models.checkpoint import load_checkpoint
    from models.shipped import resolve_checkpoint
    from models.step import StreamingDecoder
    from models.translate import simulate
    torch.set_num_threads(1)
    model, tok, _ = load_checkpoint(resolve_checkpoint(checkpoint))
    lines = [s for s in open(source, encoding="utf-8").read().splitlines() if 0 < len(s.split()) <= 30][:n]
    results, states = simulate(StreamingDecoder(model, tok), lines, batch_size=32, record=True)
    layers = model.cfg.decoder_layers
    steps = [[] for _ in range(layers)]
    even, tail_share, tails, end_pos = [], [], [], [[] for _ in range(layers)]
    for r, s in zip(results, states):
        full = r.source_subwords + 1
        even.append(full / r.target_tokens)
        tails.append(sum(d == full for d in r.token_delays))  # pieces (EOS included) after the source ended
        tail_share.append(tails[-1] / r.target_tokens)
        ps = [rec["p"] for rec in s.record]
        live = [i for i, d in enumerate(r.token_delays[: len(ps)]) if d < full]
        for layer in range(layers):
            steps[layer].extend(ps[i][layer] - ps[i - 1][layer] for i in live if i > 0)
            if live:  # the last position predicted before the source ended, as a share of |x|
                end_pos[layer].append(ps[live[-1]][layer] / full)
    print(f"{checkpoint}: {len(lines)} sentences of {source}")
    print(f"evenly advancing alignment: {statistics.mean(even):.2f} source pieces per target piece")
    print(f"share of each translation written after the source ended: {100 * statistics.mean(tail_share):.0f}%")
    tails.sort()
    q = {p: tails[min(len(tails) - 1, int(p / 100 * len(tails)))] for p in (50, 90, 99)}
    print(f"target pieces written after the source ended: mean {statistics.mean(tails):.1f}, p50 {q[50]}, "
          f"p90 {q[90]}, p99 {q[99]}, max {tails[-1]}")
    print("| layer | mean Δp while the source arrives | p at the last live piece / (|x| + EOS) |")
    print("|---:|---:|---:|")
    for layer in range(layers):
        print(f"| {layer + 1} | {statistics.mean(steps[layer]):.2f} | {statistics.mean(end_pos[layer]):.2f} |")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(args[:2]), *([int(args[2])] if len(args) > 2 else []))
