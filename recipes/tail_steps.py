"""What a lone speaker's last words wait for: the step's time while the words arrive and after the source ended,
and how many steps, and how many milliseconds of steps, a sentence's translation takes after its last word.

    python recipes/tail_steps.py                               # gma_delta1, 64 unseen sentences, batch 1
    python recipes/tail_steps.py --forms default,gemv --batch 8

Each sentence is streamed word by word by `simulate` (its streams in lockstep, `--batch` at a time); every
`StreamingDecoder.step` call is timed and counted as a *word step* (a word of some stream still to come) or a
*tail step* (every stream's source has ended: what is left is written one subword a step). A speaker who ends
the sentence right after its last word (`bench server`'s speakers do) waits, for the words written after that
word, for every step the stream takes from it on: those written before the end is known (still "live" in
`bench server`'s terms) and the tail. `after the last word` counts them per sentence and adds up their measured
times (at `--batch 1`, the stream's own steps), so on a slow CPU it is what a lone speaker's p99 is made of.
Forms take turns within each round (the first `--warm` sentences once untimed, then all of them timed), so a slow
spell falls on every form alike; `tokens` is a digest of what each form wrote (float32 forms agree; int8 writes
its own).
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.checkpoint import load_checkpoint  # noqa: E402
from models.cpu_info import cpu_summary  # noqa: E402
from models.shipped import resolve_checkpoint  # noqa: E402
from models.benchmarks.host_overhead import TimedDecoder  # noqa: E402
from models.translate import simulate  # noqa: E402
from server.bench import pct  # noqa: E402


class TailClock(TimedDecoder):
    """TimedDecoder (a clock around every step) that also notes, per step, whether every stream in it had its source
    ended, and per stream the indices of its steps and how many it had taken when its last words arrived."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ended: list[bool] = []                # per timed step: all of its streams past their end
        self.steps_of: dict[int, list[int]] = {}   # id(stream) -> indices (into step_seconds) of its steps
        self.at_last_push: dict[int, int] = {}     # id(stream) -> its steps taken before its latest push

    def push(self, s, words, *args, **kwargs):
        self.at_last_push[id(s)] = len(self.steps_of.get(id(s), ()))
        return super().push(s, words, *args, **kwargs)

    def step(self, states, *args, **kwargs):
        out = super().step(states, *args, **kwargs)
        self.ended.append(all(s.end_received for s in states))
        for s in states:
            self.steps_of.setdefault(id(s), []).append(len(self.step_seconds) - 1)
        return out


def stream_group(dec: TailClock, group: list[str], word: list, tail: list, after: list, tokens: list) -> None:
    """Stream `group` word by word through `simulate` (the project's one streaming loop, its streams in lockstep);
    step times into `word` / `tail`, each stream's (steps, seconds) after its last word into `after`, its tokens
    into `tokens`."""
    dec.step_seconds, dec.ended, dec.steps_of, dec.at_last_push = [], [], {}, {}
    simulate(dec, group, batch_size=len(group), tokens_out=tokens)
    for seconds, ended in zip(dec.step_seconds, dec.ended):
        (tail if ended else word).append(seconds)
    for key, steps in dec.steps_of.items():
        last = steps[dec.at_last_push[key]:]
        after.append((len(last), sum(dec.step_seconds[i] for i in last)))


def quantiles(values: list[float]) -> list[float]:
    """mean, p90, p99, max (the percentiles as `bench server` takes them)"""
    return [statistics.fmean(values), pct(values, 90), pct(values, 99), max(values)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="gma_delta1")
    p.add_argument("--source", default="data/de-en-everyday/test.unseen.de")
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--batch", type=int, default=1, help="streams stepped together (lockstep)")
    p.add_argument("--forms", default="default,gemv,int8,plain")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warm", type=int, default=16, help="sentences streamed once untimed first (first-call costs)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, _ = load_checkpoint(resolve_checkpoint(args.model), torch.device("cpu"), torch.float32)
    forms = args.forms.split(",")
    decs = {f: TailClock(model, tok, form=f) for f in forms}
    with open(args.source, encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()][:args.sentences]
    runs = {f: ([], [], [], []) for f in forms}
    with torch.inference_mode():
        for timed, todo in ((False, sentences[:args.warm]), (True, sentences)):
            for start in tqdm(range(0, len(todo), args.batch), desc="timed" if timed else "warm-up", leave=False,
                              unit="group", disable=not sys.stderr.isatty()):
                for f in forms:
                    word, tail, after, tokens = runs[f] if timed else ([], [], [], [])
                    stream_group(decs[f], todo[start:start + args.batch], word, tail, after, tokens)
    print(f"CPU: {cpu_summary()['line']}; torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{args.model}, {len(sentences)} sentences of {args.source} word by word, {args.batch} at a time")
    print("| form | word steps | ms a word step | tail steps | ms a tail step "
          "| steps after the last word: mean / p90 / p99 / max | ms after the last word: mean / p90 / p99 / max "
          "| tokens |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    for f in forms:
        word, tail, after, tokens = runs[f]
        n = quantiles([steps for steps, _ in after])
        ms = quantiles([seconds * 1000 for _, seconds in after])
        print(f"| {f} | {len(word)} | {statistics.fmean(word) * 1000:.2f} | {len(tail)} "
              f"| {statistics.fmean(tail) * 1000:.2f} | {n[0]:.1f} / {n[1]:.0f} / {n[2]:.0f} / {n[3]:.0f} "
              f"| {ms[0]:.0f} / {ms[1]:.0f} / {ms[2]:.0f} / {ms[3]:.0f} "
              f"| {hashlib.sha256(repr(tokens).encode()).hexdigest()[:8]} |")


if __name__ == "__main__":
    main()
