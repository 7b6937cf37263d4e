"""One log line per websocket: a stream's summary when it closes, or why a connection was refused.

What an operator needs to answer "what happened to my client": the address, the model and its setting, how
long the stream lasted, how many sentences and words went in and came out, how late the server wrote them
(the words' `lag_ms`: mean and max), and what ended it. Never the text:
what people say in a live talk or a chat stays out of the server's logs. The logger is `simulserve.streams`
(INFO); `--log-level warning` silences it with the rest, and a logging configuration can route it apart.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("simulserve.streams")

SHUTDOWN_CODES = {1001: "going away", 1012: "restarting"}   # what a stopping server closes its streams with


@dataclass
class StreamRecord:
    """What a Session counts as it goes."""
    ip: str
    opened: float                 # time.monotonic() at accept
    stream: str | None = None     # `ready`'s stream id
    model: str | None = None
    setting: str = ""             # "k=3", "delta=1", "" (offline), with ", auto_segment"
    words_in: int = 0             # source words accepted
    words_out: int = 0            # target words sent
    lag_sum_ms: float = 0.0       # their lag_ms (the server's time from the input a word needed to its emission)
    lag_max_ms: float = 0.0
    sentences: int = 0            # sentence messages sent
    ended: bool = False           # the `end` message went out: the client's end_stream, finished
    error: str | None = None      # the fatal error's code sent (idle_timeout, server_busy, ...)
    last_error: str | None = None  # the last other error's code (bad_setting, backlog_full, ...)
    dropped: str | None = None    # the connection was dropped (slow_consumer)
    close_code: int | None = None  # the client's (or a stopping server's) close code

    def wrote(self, lag_ms: float) -> None:
        self.words_out += 1
        self.lag_sum_ms += lag_ms
        self.lag_max_ms = max(self.lag_max_ms, lag_ms)

    def outcome(self) -> str:
        if self.ended:
            return "ended by the client (end_stream)"
        if self.dropped:
            return f"dropped: {self.dropped}"
        if self.error:
            return f"closed by the server: {self.error}"
        if self.close_code in SHUTDOWN_CODES:
            return f"server stopping (close code {self.close_code}, {SHUTDOWN_CODES[self.close_code]})"
        after = f" after error {self.last_error}" if self.last_error else ""
        if self.close_code is not None:
            return f"the client closed the connection (close code {self.close_code}){after}"
        return f"the connection ended{after}"

    def line(self, now: float) -> str:
        who = f"stream {self.stream}" if self.stream else "connection without a stream"
        what = f"{self.model}" + (f" ({self.setting})" if self.setting else "") if self.model else "no model"
        lag = f" (lag mean {self.lag_sum_ms / self.words_out:.0f} ms, max {self.lag_max_ms:.0f} ms)" \
            if self.words_out else ""
        return (f"{who} from {self.ip}: {what}, {now - self.opened:.1f} s, {self.sentences} sentence(s), "
                f"{self.words_in} word(s) in, {self.words_out} out{lag}; {self.outcome()}")


def setting(k, delta, auto_segment: bool, shared: bool = False) -> str:
    parts = ([f"k={k:g}"] if k is not None else []) + ([f"delta={delta:g}"] if delta is not None else [])
    return ", ".join(parts + (["auto_segment"] if auto_segment else []) + (["shared"] if shared else []))


def refused(ip: str, code: str) -> None:
    log.info("connection from %s refused: %s", ip, code)
