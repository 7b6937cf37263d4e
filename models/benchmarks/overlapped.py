"""Two lockstep groups whose steps overlap, as the server's jobs on a GPU: `bench step --arrivals overlapped`.

`simulate` steps one batch at a time: `step` queues a step's kernels, waits for its decisions and applies them,
so on a GPU the device idles while the host plans the next step and applies the last one's results. The server's
engine does not step that way on a GPU (`--overlap`, server/engine.py): it launches job N+1 before it collects job
N, so that one job's host work runs while the device computes the other's. This driver steps sentences that way:
two lanes, each a lockstep group of `batch` sentences (simulate's rule: every waiting stream gets its next word at
once, then the group steps until every stream waits), the next group taken from a shared queue when a lane's is
done. Each turn collects one lane's step while the other lane's is in flight and launches its next:

    launch A1, launch B1, collect A1, launch A2, collect B1, launch B2, collect A2, ...

Its wall time per step is what the stepping loop costs a step when the host's work hides behind the device's,
against the same kernels as a step of `batch` rows: the time in the decoder's `launch` and `collect` calls (on a
GPU `collect` waits there for whatever of its step the device has not done), over the launches. As for `simulate`,
whose clock is around `step` (= launch + collect), the driver's own bookkeeping between the calls (which streams
move, the next words, already split into subwords) is outside the clock; on a GPU it runs while the device
computes, so it may hide a few µs of device time a step that `simulate`'s clock would count. A stream's tokens
do not depend on which steps it shares, so the translations are simulate's (tests). With fewer than 2 x `batch`
sentences the second lane has nothing to do and the steps run one after another.
"""
from __future__ import annotations

import time
from collections import deque

import torch

from models.step import PendingStep, StreamingDecoder
from models.translate import SentenceResult


class _Lane:
    """One lockstep group at a time: its streams, their words, and the next states to step."""

    def __init__(self, decoder: StreamingDecoder, todo: deque, batch: int, results: list):
        self.decoder, self.todo, self.batch, self.results = decoder, todo, batch, results
        # (index, sentence, its words each with its subwords, state)
        self.group: list[tuple[int, str, list[tuple[str, list[list[int]]]], object]] = []
        self.fed: list[int] = []

    def next_states(self) -> list:
        """The states to launch next (none: the lane is out of sentences). Pushes the next word to every waiting
        stream once none can move, and takes the next group once every stream of this one is done."""
        dec = self.decoder
        while True:
            if self.group and all(state.done for *_, state in self.group):
                self.close()
            if not self.group:
                if not self.todo:
                    return []
                for _ in range(min(self.batch, len(self.todo))):
                    i, sentence = self.todo.popleft()
                    words = sentence.split()
                    self.group.append((i, sentence, [(w, [dec.tok.encode_word(w)]) for w in words],
                                       dec.new_stream()))
                self.fed = [0] * len(self.group)   # (new streams take their first words before any step, as simulate)
            else:
                moving = [state for *_, state in self.group if not (state.done or state.blocked)]
                if moving:
                    return moving
            for j, (i, _, words, state) in enumerate(self.group):   # every stream waits: its next word, or the end
                if state.done:
                    continue
                if self.fed[j] < len(words):
                    dec.push(state, *words[self.fed[j]])
                    self.fed[j] += 1
                elif not state.end_received:
                    dec.finish(state)
                else:
                    raise RuntimeError(f"stream {i} stalled after the end of its source (a decoder bug)")

    def close(self) -> None:
        """The finished group's results, in their sentences' places; its slots freed."""
        for i, sentence, _, state in self.group:
            if state.done:
                self.results[i] = SentenceResult.of(sentence, state, 0.0)
            self.decoder.close(state)
        self.group = []


@torch.inference_mode()   # (as simulate: once for the loop)
def overlapped(decoder: StreamingDecoder, sentences: list[str], batch: int) -> tuple[list[SentenceResult], int, float]:
    """Translate `sentences` in two lanes of lockstep groups of `batch`, their steps overlapped (module
    docstring). Returns the SentenceResults in the order given, the steps launched, and the seconds in their
    `launch` and `collect` calls (on CUDA with a synchronize after the last)."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    todo = deque(enumerate(sentences))
    results: list[SentenceResult | None] = [None] * len(sentences)
    lanes = [_Lane(decoder, todo, batch, results) for _ in range(2)]
    pending: list[PendingStep | None] = [None, None]
    steps, seconds = 0, 0.0
    clock = time.perf_counter
    try:
        while True:
            for j, lane in enumerate(lanes):
                if pending[j] is not None:   # (the other lane's step is in flight meanwhile)
                    p, pending[j] = pending[j], None
                    t0 = clock()
                    decoder.collect(p)
                    seconds += clock() - t0
                states = lane.next_states()
                if states:
                    t0 = clock()
                    pending[j] = decoder.launch(states)
                    seconds += clock() - t0
                    steps += 1
            if all(p is None for p in pending):
                break
        t0 = clock()   # (every collect waited for its step already: this is what was left, on CUDA)
        decoder.synchronize()
        seconds += clock() - t0
    finally:
        for p in pending:   # (an error mid-round: nothing left in flight, every slot freed)
            if p is not None:
                decoder.collect(p)
        for lane in lanes:
            lane.close()
    return results, steps, seconds
