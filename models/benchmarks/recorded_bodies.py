"""The graph forms' host work alone, with the graphs' bodies taken out: `recipes/host_python.py --bodies recorded`.

On the CPU the graph forms run their bodies eagerly where a GPU would replay them, so a step's host work there
runs between milliseconds of model compute that evict the host's caches: the step's Python then reads cold
memory, and the host's share of a step measures more than a GPU's host would spend (whose replays are
launches). `RecordedBodies` runs one round with the bodies and keeps what each replay returned, in order; the
rounds after it return those outputs without computing. The host then does exactly the same work (the same
decisions read back, the same streams moved on), with its caches warm: what `bench step`'s "outside graphs"
would be on a device that took no time.

On CUDA the same rounds leave the device nothing to compute: a replayed round launches no graph, and what is left
of its step is the host's Python with the CUDA calls outside the graphs (the one upload, the read back and its
wait on a copy of a few values): the host's floor a step on that machine, against which `bench step`'s wall less
the graphs' span tells the host's share from the device's idle time.

Only for a driver that makes the same replays every round (the benchmarks' lockstep, staggered and overlapped
arrivals over the same sentences); a replay of another shape than recorded is an error, never a silent mix.
The device's own state (the cache pool, the slot rows) stops moving in the recorded rounds: nothing on the host
reads it, and the step's results come from the recorded decisions.
"""
from __future__ import annotations


class RecordedBodies:
    """Wraps the bodies of `graphs` (models/cuda_graphs.DecoderGraphs: eager on the CPU, captured graphs on CUDA):
    `record()` for a round that runs them and keeps their outputs, `replay()` for rounds that return the kept
    outputs instead; `restore()` puts the graphs' own entries back."""

    def __init__(self, graphs):
        self.graphs = graphs
        self.rounds: dict = {}   # round name -> [(graph key, what its body returned)], in replay order
        self.kept: list[tuple] = []   # the round being recorded or replayed
        self.at = 0                    # the next kept output a replayed round returns
        self.recording = True
        self.entries = dict(graphs.entries)   # (restore)
        for key, (graph, static, out) in self.entries.items():
            # an eager entry's third item is its body; a captured one's is its graph's output, after a replay
            body = out if graph is None else (lambda *_, graph=graph, out=out: graph.replay() or out)
            graphs.entries[key] = (None, static, self._body(key, body))   # (run as eager bodies: _replay)

    def record(self, name="round") -> None:
        """The next round runs the bodies and keeps their outputs under `name` (one name a driving: e.g. a batch
        size), in place of any kept before under it."""
        self.recording, self.kept, self.at = True, [], 0
        self.rounds[name] = self.kept

    def replay(self, name="round") -> None:
        """The next round returns the outputs kept under `name`, in order, without running the bodies."""
        if name not in self.rounds:
            raise RuntimeError(f"no round recorded as {name!r}: call record({name!r}) and run one round first")
        self.recording, self.kept, self.at = False, self.rounds[name], 0

    def finished(self) -> bool:
        """Whether the round replayed every kept output (a round that took fewer replays drove other steps)."""
        return self.recording or self.at == len(self.kept)

    def restore(self) -> None:
        """The graphs' own entries back."""
        self.graphs.entries.update(self.entries)

    def _body(self, key: tuple, body):
        def run(*static):
            if self.recording:
                out = body(*static)
                self.kept.append((key, None if out is None else out.clone()))
                return out
            if self.at >= len(self.kept):
                raise RuntimeError(f"replay {self.at + 1} of a round that recorded {len(self.kept)}: the driver "
                                   "steps differently from the recorded round")
            kept_key, out = self.kept[self.at]
            if kept_key != key:
                raise RuntimeError(f"replay {self.at + 1} is graph {key}, the recorded round's was {kept_key}: the "
                                   "driver steps differently from the recorded round")
            self.at += 1
            return out
        return run
