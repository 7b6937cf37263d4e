"""WebVTT subtitles of a stream's translation as it was shown live (`simulserve stream --vtt FILE`).

Roll-up captions, as the caption line grew: every arriving word starts a cue that shows the last two lines of
text with that word at the end, until the next word arrives (or HOLD_S seconds, then the screen is blank). A
sentence starts a new line; a line holds at most LINE_CHARS characters. Times are the words' `received_s`: the
speaker's clock of a paced stream, or seconds since the stream opened. A recording of the talk played with the
file shows each word when the live audience saw it.
"""
from __future__ import annotations

LINE_CHARS = 42   # the usual width of a subtitle line
HOLD_S = 5.0      # the last text stays up this long when no word follows


def timestamp(seconds: float) -> str:
    ms = max(0, round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cues(words: list[dict]) -> list[tuple[float, float, str]]:
    """(start s, end s, text) of each cue, from `word` messages in arrival order (`sentence`, `text`,
    `received_s`). Words that arrived within a millisecond (one step wrote them) share one cue: the last one's text."""
    out, lines, sentence = [], [], None
    for i, w in enumerate(words):
        text = w["text"]
        if w["sentence"] != sentence or len(" ".join(lines[-1] + [text])) > LINE_CHARS:
            lines.append([text])
            sentence = w["sentence"]
        else:
            lines[-1].append(text)
        start = w["received_s"]
        end = start + HOLD_S if i + 1 == len(words) else min(words[i + 1]["received_s"], start + HOLD_S)
        if round(end * 1000) > round(start * 1000):   # (as the file shows them: milliseconds)
            out.append((start, end, "\n".join(" ".join(line) for line in lines[-2:])))
    return out


def webvtt(words: list[dict]) -> str:
    blocks = ["WEBVTT\n"]
    for start, end, text in cues(words):
        blocks.append(f"{timestamp(start)} --> {timestamp(end)}\n{_escape(text)}\n")
    return "\n".join(blocks)
