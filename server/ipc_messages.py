"""The messages between the front ends and the engine processes of `simulserve serve --workers N [--engines E]`
(server/ipc.py carries them; docs/server.md#several-processes---workers-n). With several engine processes a
front end sends Connect (and gets Collect) from the primary only, a stream's messages to the engine it started
on, Disconnect and LoopLate to all.

A front end asks (`req` numbers a request; the engine process answers with `Reply(req, value)`):
    Connect     at the websocket upgrade: the global limits (per-address connections and failed keys,
                readiness, max_streams); value: None (counted) or (error code, message or None)
    Attach      at `start`, after the checks a front end makes itself: admission by headroom and the
                stream's handle; value: None (attached) or the `server_busy` error. `final`: no other engine
                is asked after this one, so a refusal here reaches the client and counts in its retry_after
    Owes        at the idle timeout: does the engine still owe this stream words? value: bool
    Status      for /health and /v1/models; value: `Status`
    Scrape      for /metrics; value: every process's samples (server/metrics_merge.py)
    ShareOpen   at `start` with `share` (primary only): value (share key, watch token) or the refusal's text
    Watch       a viewer's first on this front end wants a feed (primary only): value its latest event or None
and tells (no answer): `ToStream` (a stream's `PushWords`, `EndSentence`, `EndStream`, server/engine.py),
`Detach`, `Disconnect`, `LoopLate` (its event loop's lateness, which adds to every word's delay), `Collected`,
and for shared captions (server/share.py, primary only) `ShareWord`, `ShareSentence`, `ShareLeft`, `Unwatch`.

The engine process sends `Events` (for each stream of that front end that a job touched: its events, the
words of its source read so far), `Collect` (a scrape wants this front end's samples), `Shared` (an event of a
feed this front end's viewers watch) and the replies.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from server.engine import Command


# ---------------------------------------------------------------- front end -> engine process
@dataclasses.dataclass(frozen=True)
class Connect:
    req: int
    conn: int
    ip: str
    origin_ok: bool
    key_ok: bool


@dataclasses.dataclass(frozen=True)
class Disconnect:
    """The websocket is gone: what it held (its address's count, its stream slot, its stream) is freed."""
    conn: int


@dataclasses.dataclass(frozen=True)
class Attach:
    req: int
    conn: int
    stream: int
    model: str
    k: Any
    delta: Any
    final: bool = True


@dataclasses.dataclass(frozen=True)
class ToStream:
    stream: int
    command: Command


@dataclasses.dataclass(frozen=True)
class Detach:
    stream: int


@dataclasses.dataclass(frozen=True)
class Owes:
    req: int
    stream: int


@dataclasses.dataclass(frozen=True)
class StatusRequest:
    req: int
    models: bool          # with each model's info() (/v1/models), not only the headroom (/health)


@dataclasses.dataclass(frozen=True)
class Scrape:
    req: int
    fronts: bool = True   # with every front end's samples (asked of the primary engine process only)


@dataclasses.dataclass(frozen=True)
class Collected:
    token: int
    samples: list


@dataclasses.dataclass(frozen=True)
class LoopLate:
    seconds: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class ShareOpen:
    req: int
    key: str | None       # None: a new feed


@dataclasses.dataclass(frozen=True)
class ShareWord:
    key: str
    sentence: int
    text: str


@dataclasses.dataclass(frozen=True)
class ShareSentence:
    key: str
    sentence: int


@dataclasses.dataclass(frozen=True)
class ShareLeft:
    key: str
    ended: bool


@dataclasses.dataclass(frozen=True)
class Watch:
    req: int
    watch: str


@dataclasses.dataclass(frozen=True)
class Unwatch:
    watch: str


# ---------------------------------------------------------------- engine process -> front end
@dataclasses.dataclass(frozen=True)
class Reply:
    req: int
    value: Any


@dataclasses.dataclass(frozen=True)
class Events:
    items: list[tuple[int, list[dict], int]]   # (stream, its events in order, source words read so far)


@dataclasses.dataclass(frozen=True)
class Collect:
    token: int


@dataclasses.dataclass(frozen=True)
class Status:
    ready: bool
    load_error: str | None
    active: int
    headroom: dict[str, Any]               # model -> server.admission.Headroom
    info: dict[str, dict] | None           # model -> ModelEngine.info(), if asked


@dataclasses.dataclass(frozen=True)
class Shared:
    watch: str
    event: dict
