"""Subtitles of a stream's translation as it was shown live (`simulserve stream --vtt FILE`, `--srt FILE`).

Roll-up captions, as the caption line grew: every arriving word starts a cue that shows the last two lines of
text with that word at the end, until the next word arrives (or HOLD_S seconds, then the screen is blank). A
sentence starts a new line; a line holds at most LINE_CHARS characters. Times are the words' `received_s`: the
speaker's clock of a paced stream, or seconds since the stream opened. A recording of the talk played with the
file shows each word when the live audience saw it.

The file is written as the stream goes (`LiveSubtitles`): a word's cue is complete, and written, when the next
word arrives, so the file is one word behind the stream and holds every cue shown so far if the client is
stopped. WebVTT (browsers' <track>, most players) and SubRip (.srt: video editors, burn-in tools) hold the
same cues.
"""
from __future__ import annotations

import re
from typing import TextIO

from server.caption_lines import LINE_CHARS, CaptionLines  # noqa: F401 - LINE_CHARS: what the tests check

HOLD_S = 5.0      # the last text stays up this long when no word follows

Cue = tuple[float, float, str]   # start s, end s, text


def timestamp(seconds: float, mark: str = ".") -> str:
    """HH:MM:SS.mmm (WebVTT), or with mark "," HH:MM:SS,mmm (SubRip)."""
    ms = max(0, round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{mark}{ms % 1000:03d}"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cue_block(cue: Cue) -> str:
    start, end, text = cue
    return f"{timestamp(start)} --> {timestamp(end)}\n{_escape(text)}\n"


# SubRip has no escapes, but players read <b>, <i>, <font …> and the like as markup, {\an8}-style blocks as ASS
# overrides, and "-->" as a timing line: a zero-width space after the opening character keeps such text as text
# (a German source word copied through <unk> can be anything)
ZWSP = "\u200b"
_SRT_MARKUP = re.compile(r"(<)(?=[A-Za-z/])|(\{)(?=\\)|(-)(?=->)")


def srt_text(text: str) -> str:
    """The text of a SubRip cue: shown as written by players that parse SubRip's markup."""
    return _SRT_MARKUP.sub(lambda m: m.group(0) + ZWSP, text)


def srt_block(number: int, cue: Cue) -> str:
    """A SubRip cue: its number from 1, times with a comma, the text guarded against markup (srt_text)."""
    start, end, text = cue
    return f"{number}\n{timestamp(start, ',')} --> {timestamp(end, ',')}\n{srt_text(text)}\n"


class RollUp:
    """The cues of `word` messages (`sentence`, `text`, `received_s`) fed in arrival order. A word's cue ends
    when the next word arrives, so `add` returns the cue it completes (or None) and `finish` the last one.
    Words that arrived within a millisecond (one step wrote them) share one cue: the last one's text."""

    def __init__(self) -> None:
        self.lines = CaptionLines()
        self.open: tuple[float, str] | None = None     # the last word's cue: start, text; its end not yet known

    def add(self, word: dict) -> Cue | None:
        self.lines.add(word["sentence"], word["text"])
        done = self._close(word["received_s"])
        self.open = (word["received_s"], "\n".join(self.lines.shown()))
        return done

    def restart(self, sentence: int) -> None:
        """A reconnect voids the words of sentences from `sentence` on: they leave the lines (cues already
        complete stay: they were shown) and come again."""
        self.lines.restart(sentence)

    def finish(self) -> Cue | None:
        """The last word's cue, shown HOLD_S seconds."""
        return self._close(None)

    def _close(self, next_start: float | None) -> Cue | None:
        if self.open is None:
            return None
        start, text = self.open
        self.open = None
        end = start + HOLD_S if next_start is None else min(next_start, start + HOLD_S)
        if round(end * 1000) > round(start * 1000):   # (as the file shows them: milliseconds)
            return start, end, text
        return None


def cues(words: list[dict]) -> list[Cue]:
    """The cues of `word` messages in arrival order; an entry {"restart": n} stands for a reconnect that sent
    sentence n and the later ones again (RollUp.restart)."""
    roll, out = RollUp(), []
    for w in words:
        if "restart" in w:
            roll.restart(w["restart"])
        else:
            out.append(roll.add(w))
    return [c for c in out + [roll.finish()] if c is not None]


def webvtt(words: list[dict]) -> str:
    return "\n".join(["WEBVTT\n"] + [cue_block(c) for c in cues(words)])


def srt(words: list[dict]) -> str:
    return "\n".join(srt_block(n, c) for n, c in enumerate(cues(words), 1))


class LiveSubtitles:
    """A subtitle file (`form` "vtt" or "srt") written as the words arrive: each cue once complete, flushed, so
    a player or a program reading the growing file sees it then, and nothing shown is lost if the client stops."""

    def __init__(self, out: TextIO, form: str = "vtt") -> None:
        if form not in ("vtt", "srt"):
            raise ValueError(f"subtitles are vtt or srt, not {form!r}")
        self.out, self.form, self.roll, self.written = out, form, RollUp(), 0
        if form == "vtt":
            self.out.write("WEBVTT\n")
        self.out.flush()

    def _write(self, cue: Cue | None) -> None:
        if cue is None:
            return
        self.written += 1
        if self.form == "vtt":
            self.out.write("\n" + cue_block(cue))
        else:
            self.out.write(("\n" if self.written > 1 else "") + srt_block(self.written, cue))
        self.out.flush()

    def word(self, msg: dict) -> None:
        self._write(self.roll.add(msg))

    def restart(self, sentence: int) -> None:
        self.roll.restart(sentence)

    def close(self) -> None:
        """The last cue, then the file is closed (a stream that ended, failed or was stopped)."""
        if self.out.closed:
            return
        try:
            self._write(self.roll.finish())
        finally:
            self.out.close()
