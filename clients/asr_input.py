"""Speech recognition's running results as the stream's input (`simulserve stream --asr-json`).

A streaming recogniser gives, while someone speaks, a partial result that it revises as it hears more ("ich
bin" → "ich bin hier" → "ich bin hierher"), and a final result when the utterance ends. The protocol's words
cannot be taken back, so a word is sent once it is stable: once two partial results in a row agree on it and
on every word before it (local agreement of two hypotheses, as Whisper-Streaming commits words: Macháček et al.
2023). A final result sends the rest of its words and ends the sentence.

Input: one JSON object per line, {"partial": "text"} or {"text": "text"} (the final result), as Vosk's
recognisers return them (`json.dumps(json.loads(rec.PartialResult()))` puts one on a line); other keys are
ignored, and so are blank lines. Output: the input lines `stream_lines` takes with `auto_segment`: the newly
stable words of a result as one line, and an empty line (end the sentence) after each final result.

`timed_lines` reads the other common form, a recogniser that prints only committed text with its times
(`simulserve stream --asr-timed`): Whisper-Streaming's `whisper_online.py` writes `EMITTED_MS BEG_MS END_MS text`
a line, its server `BEG_MS END_MS text`. Committed text is never revised, so each line's words go out as
they come; its punctuation ends the sentences (with `--end-after-pause`, so does a pause).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator


class AsrInputError(ValueError):
    pass


class Stabilizer:
    """The words of one utterance sent so far, and the last partial result's words."""

    def __init__(self) -> None:
        self.sent: list[str] = []       # this utterance's words sent so far
        self.last: list[str] = []       # the previous partial result's words
        self.revised = 0                # words revised by the recogniser after they were sent (kept as sent)
        self.utterances = 0

    def partial(self, text: str) -> list[str]:
        """The words of this partial result that became stable (agree with the previous one) and are not sent."""
        words = text.split()
        stable = 0
        for a, b in zip(self.last, words):
            if a != b:
                break
            stable += 1
        self.last = words
        return self._send(words, stable)

    def final(self, text: str) -> tuple[list[str], bool]:
        """The final result's words not sent yet, and whether the utterance sent any word (a recogniser's empty
        final result after silence ends nothing); the utterance ends."""
        words = text.split()
        new = self._send(words, len(words))
        spoke = bool(self.sent)
        self.sent, self.last = [], []
        self.utterances += spoke
        return new, spoke

    def _send(self, words: list[str], upto: int) -> list[str]:
        n = len(self.sent)
        if upto <= n:
            return []
        # a word sent before and revised since stays as it was sent: count it, go on after it
        self.revised += sum(a != b for a, b in zip(self.sent, words))
        new = words[n:upto]
        self.sent += new
        return new


def stable_lines(lines: Iterable[str], stabilizer: Stabilizer | None = None) -> Iterator[str]:
    """`stream_lines` input lines (auto_segment) from recogniser result lines; AsrInputError names a bad line."""
    st = stabilizer or Stabilizer()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            result = json.loads(line)
        except json.JSONDecodeError as e:
            raise AsrInputError(f"--asr-json: line {number} is not JSON ({e.msg}): {line.strip()[:80]!r}") from None
        if not isinstance(result, dict) or not isinstance(result.get("partial", result.get("text")), str):
            raise AsrInputError(f"--asr-json: line {number} has no \"partial\" or \"text\" string: "
                                f"{line.strip()[:80]!r}")
        if "text" in result:
            new, spoke = st.final(result["text"])
            if new:
                yield " ".join(new)
            if spoke:
                yield ""          # the utterance ends: so does its sentence
        else:
            new = st.partial(result["partial"])
            if new:
                yield " ".join(new)


_TIME = re.compile(r"\d+(?:\.\d+)?")


def timed_lines(lines: Iterable[str]) -> Iterator[str]:
    """The text of each `[EMITTED] BEG END text` line, the times dropped; AsrInputError names a bad line."""
    times = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if times is None:
            # the form, from the first line: whisper_online.py's emission time has decimals ("%1.4f"), the
            # segment's times have none ("%1.0f"), so text that starts with a number is still text
            times = 3 if "." in line.split()[0] else 2
        parts = line.split(None, times)
        if len(parts) < times or not all(_TIME.fullmatch(t) for t in parts[:times]):
            form = "EMITTED BEG END text" if times == 3 else "BEG END text"
            raise AsrInputError(f"--asr-timed: line {number} is not `{form}` as the first line was: "
                                f"{line.strip()[:80]!r}")
        text = parts[times].strip() if len(parts) > times else ""
        if text:
            yield text
