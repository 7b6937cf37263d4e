"""What a lone speaker's last words wait for: the step's time while the words arrive and after the source ended,
and how many steps a sentence's tail takes, per step form.

    python recipes/tail_steps.py                               # gma_delta1, 64 unseen sentences, batch 1
    python recipes/tail_steps.py --forms default,unpacked --batch 8

Each sentence is streamed word by word as `simulate` does (its streams in lockstep, `--batch` at a time); every
`StreamingDecoder.step` call is timed and counted as a *word step* (a word of some stream still to come) or a
*tail step* (every stream's source has ended: what is left is written one subword a step). Once a sentence's
source has ended, its last word waits for all of its tail's steps, so on a slow CPU the tail decides the p99 of
`bench server`'s "after the end" delays even with one speaker: a tail of n steps of t ms each adds about n·t.
Forms take turns within each round (the second round is the timed one), so a slow spell falls on every form alike;
`tokens` is a digest of what each form wrote (float32 forms agree; int8 writes its own).
"""
from __future__ import annotations

import argparse
import hashlib
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


def stream_group(dec: StreamingDecoder, group: list[str], word: list, tail: list, tails: list, tokens: list) -> None:
    """Stream `group` word by word in lockstep; step times into `word` / `tail`, steps after each end into `tails`."""
    states = [dec.new_stream() for _ in group]
    words, pos, after_end = [s.split() for s in group], [0] * len(group), [0] * len(group)
    try:
        while not all(s.done for s in states):
            live = [i for i, s in enumerate(states) if not s.done]
            for i in live:   # each waiting stream gets its next word, or its end
                if pos[i] < len(words[i]):
                    dec.push(states[i], [words[i][pos[i]]])
                    pos[i] += 1
                elif not states[i].end_received:
                    dec.finish(states[i])
            while live := [i for i in live if not states[i].done]:   # step until every stream waits
                t0 = time.perf_counter()
                outs = dec.step([states[i] for i in live])
                seconds = time.perf_counter() - t0
                ended = all(states[i].end_received for i in live)
                (tail if ended else word).append(seconds)
                for i in live:
                    after_end[i] += states[i].end_received
                if not any(o.action == "write" for o in outs):
                    break
        tails.extend(after_end)
        tokens.extend(tuple(s.target_tokens) for s in states)
    finally:
        for s in states:
            dec.close(s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="gma_delta1")
    p.add_argument("--source", default="data/de-en-everyday/test.unseen.de")
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--batch", type=int, default=1, help="streams stepped together (lockstep)")
    p.add_argument("--forms", default="default,unpacked,int8,plain")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, _ = load_checkpoint(resolve_checkpoint(args.model), torch.device("cpu"), torch.float32)
    forms = args.forms.split(",")
    decs = {f: StreamingDecoder(model, tok, form=f) for f in forms}
    with open(args.source, encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()][:args.sentences]
    runs = {f: ([], [], [], []) for f in forms}
    with torch.inference_mode():
        for timed in (False, True):
            for start in range(0, len(sentences), args.batch):
                for f in forms:
                    word, tail, tails, tokens = runs[f] if timed else ([], [], [], [])
                    stream_group(decs[f], sentences[start:start + args.batch], word, tail, tails, tokens)
    print(f"CPU: {cpu_summary()['line']}; torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{args.model}, {len(sentences)} sentences of {args.source} word by word, {args.batch} at a time")
    print("| form | word steps | ms a word step | tail steps | ms a tail step "
          "| tail steps a sentence: mean / p90 / max | tail ms a sentence: mean / p90 / max | tokens |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    for f in forms:
        word, tail, tails, tokens = runs[f]
        mean_tail = statistics.fmean(tail) * 1000
        ms = sorted(n * mean_tail for n in tails)
        q90 = sorted(tails)[int(0.9 * (len(tails) - 1))]
        print(f"| {f} | {len(word)} | {statistics.fmean(word) * 1000:.2f} | {len(tail)} | {mean_tail:.2f} "
              f"| {statistics.fmean(tails):.1f} / {q90} / {max(tails)} "
              f"| {statistics.fmean(ms):.0f} / {ms[int(0.9 * (len(ms) - 1))]:.0f} / {ms[-1]:.0f} "
              f"| {hashlib.sha256(repr(tokens).encode()).hexdigest()[:8]} |")


if __name__ == "__main__":
    main()
