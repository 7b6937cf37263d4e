"""The caption lines of a roll-up display, as words arrive: what the live subtitles (clients/subtitles.py) and the
shared captions' viewers (server/share.py) show. A sentence starts a new line; a line holds at most LINE_CHARS
characters; the display shows the last two lines."""
from __future__ import annotations

import json

LINE_CHARS = 42   # the usual width of a subtitle line
SHOWN = 2         # lines on screen
# sentences whose lines are kept: a restart voids the unfinished sentences (a few), and what shows after it are
# the lines before them; a long talk keeps no more
KEPT = 16


class CaptionLines:
    def __init__(self) -> None:
        self.lines: list[tuple[int, list[str]]] = []   # (sentence, its words on that line); one sentence a line

    def add(self, sentence: int, text: str) -> None:
        if not self.lines or self.lines[-1][0] != sentence or \
                len(" ".join(self.lines[-1][1] + [text])) > LINE_CHARS:
            self.lines.append((sentence, [text]))
        else:
            self.lines[-1][1].append(text)
        if self.lines[0][0] < sentence - KEPT:
            self.lines = [line for line in self.lines if line[0] >= sentence - KEPT]

    def restart(self, sentence: int) -> None:
        """A reconnect voids the words of sentences from `sentence` on: they leave the lines and come again."""
        self.lines = [line for line in self.lines if line[0] < sentence]

    def shown(self) -> list[str]:
        return [" ".join(words) for _, words in self.lines[-SHOWN:]]


# A caption feed on the wire (Server-Sent Events, clients/web/viewer.html reads it): the server's shared captions
# (server/share.py) and `simulserve stream --serve-captions` (clients/caption_feed.py) send the same
KEEPALIVE_TEXT = ": keep-alive\n\n"   # a comment, so that proxies do not close an idle feed


def sse_text(event: dict) -> str:
    """An event ({"lines": [...], "ended": bool}) as one Server-Sent Event."""
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
