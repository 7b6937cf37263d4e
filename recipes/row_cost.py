"""What one row of a step costs the host when its objects are cold: `StreamingDecoder._results` (each stream's
decision applied: a token written, words released, or words read) timed per row with the caches warm, and again
after a sweep of N MB between rounds, as a step's other work (the CPU's compute, the other streams of a server,
the event loop) sweeps them in an engine.

    python recipes/row_cost.py                      # 1,024 streams, jobs of 256, sweeps of 0, 2 and 16 MB

Inside the engine flat out the per-row Python runs several times slower than alone (docs/benchmarks.md, "What a
row costs"); this shows how much of that the memory alone explains. The decisions are made up (a READ where
words wait with probability --read-share, else the next subword of the sentence's reference translation), the
model is an untrained d_model-32 one of the checkpoint's kind (the host's work per row does not depend on it).
What set-up made is frozen out of the garbage collector's sight, as in the server; a collection that falls in a
timed job still counts (the mean shows it, the median mostly not).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.checkpoint import load_checkpoint  # noqa: E402
from models.cpu_info import cpu_summary  # noqa: E402
from models.shipped import resolve_checkpoint  # noqa: E402
from models.step import StreamingDecoder  # noqa: E402
from models.transformer import Transformer  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="gma_delta1", help="checkpoint whose kind and tokenizer are used")
    p.add_argument("--source", default="data/de-en-everyday/test.de")
    p.add_argument("--target", default="data/de-en-everyday/test.en", help="the references the WRITEs follow")
    p.add_argument("--streams", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256, help="rows a job")
    p.add_argument("--rounds", type=int, default=60, help="jobs timed per sweep size")
    p.add_argument("--sweeps", default="0,2,16", help="MB of memory swept between two jobs, per run")
    p.add_argument("--read-share", type=float, default=0.3)
    args = p.parse_args()
    torch.set_num_threads(1)
    pairs = []
    if Path(args.source).is_file() and Path(args.target).is_file():
        lines = zip(Path(args.source).read_text().splitlines(), Path(args.target).read_text().splitlines())
        pairs = [(s.split(), t) for s, t in lines if s.split() and t]
    if not pairs:
        p.error(f"no sentence pairs in {args.source} and {args.target} (simulserve prepare-data makes the default)")
    model, tok, _ = load_checkpoint(resolve_checkpoint(args.model))
    torch.manual_seed(0)
    cfg = dataclasses.replace(model.cfg, d_model=32, n_heads=4, d_ffn=64, encoder_layers=1, decoder_layers=1)
    dec = StreamingDecoder(Transformer(cfg).eval(), tok)
    dec.pool.reserve(args.streams + 1)
    refs = [tok.encode(t) for _, t in pairs]
    rng = random.Random(0)

    def new():
        i = rng.randrange(len(pairs))
        s = dec.new_stream()
        dec.push(s, pairs[i][0])
        dec.finish(s)
        return s, refs[i]

    streams = [new() for _ in range(args.streams)]
    gc.collect()   # as the server does once loaded: a collection then skips what set-up made (server/app.py)
    gc.freeze()
    print(f"CPU: {cpu_summary()['line']}; {args.streams} streams, jobs of {args.batch} rows, {args.rounds} jobs each")
    print("| swept between jobs | µs a row, median job | µs a row, mean | of which READs |")
    print("|---:|---:|---:|---:|")
    for mb in (float(x) for x in args.sweeps.split(",")):
        sweep = torch.ones(max(int(mb * 2**20 / 4), 1))
        per_row, reads = [], 0
        for _ in range(args.rounds + 3):   # (the first three: warming up)
            picked = rng.sample(range(len(streams)), min(args.batch, len(streams)))
            batch = [streams[i][0] for i in picked]
            decided = []
            for i in picked:
                s, ref = streams[i]
                if s.inbox and rng.random() < args.read_share:
                    decided.append([1, s.available + 1, 0])
                else:
                    decided.append([0, 0, ref[min(len(s.target_tokens), len(ref) - 1)]])
            if mb:
                sweep.mul_(1.0)   # reads and writes every byte of it
            t0 = time.perf_counter()
            dec._results(batch, decided, None, range(len(batch)), [None] * len(batch))
            per_row.append((time.perf_counter() - t0) / len(batch))
            reads += sum(d[0] for d in decided)
            for i in picked:   # a stream whose sentence is done (or long enough) gives way to a new one
                s, ref = streams[i]
                if s.done or len(s.target_tokens) >= len(ref):
                    dec.close(s)
                    streams[i] = new()
        timed = per_row[3:]
        print(f"| {mb:g} MB | {1e6 * statistics.median(timed):.2f} | {1e6 * statistics.mean(timed):.2f} "
              f"| {100 * reads / (len(per_row) * args.batch):.0f}% |")


if __name__ == "__main__":
    main()
