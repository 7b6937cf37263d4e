"""`simulserve stream --vtt`: WebVTT roll-up subtitles of the translation, each word when it arrived."""
from __future__ import annotations

import base64
import json
import re

import pytest

from clients.subtitles import HOLD_S, LINE_CHARS, cues, timestamp, webvtt
from test_browser import browser   # noqa: F401 - the fixture
from test_client import KEY, cli, reference, sentences, server   # noqa: F401 - the fixtures

CUE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d\d\d) --> (\d\d):(\d\d):(\d\d)\.(\d\d\d)$")


def word(sentence, text, t):
    return {"type": "word", "sentence": sentence, "text": text, "received_s": t}


def seconds(h, m, s, ms):
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def parse(vtt: str) -> list[tuple[float, float, str]]:
    """The cues of a WebVTT file, checking its shape: the header, then blocks of a timing line and text."""
    blocks = vtt.split("\n\n")
    assert blocks[0] == "WEBVTT"
    out = []
    for block in filter(None, blocks[1:]):
        timing, text = block.split("\n", 1)
        m = CUE.match(timing)
        assert m, timing
        out.append((seconds(*m.groups()[:4]), seconds(*m.groups()[4:]), text.rstrip("\n")))
    return out


def test_roll_up_cues_show_the_last_two_lines_until_the_next_word():
    long = ["wordy"] * 9                        # 9 × 6 - 1 = 53 characters: over one line
    words = [word(0, "Click", 1.0), word(0, "Save", 1.4), word(0, "now.", 1.4),   # two in one step
             word(1, "A", 2.0)] + [word(1, w, 3.0 + i) for i, w in enumerate(long)] + [word(2, "<b>&", 30.0)]
    got = cues(words)
    assert got[0] == (1.0, 1.4, "Click")
    assert got[1] == (1.4, 2.0, "Click Save now.")      # the step's two words: one cue, the last one's text
    assert got[2] == (2.0, 3.0, "Click Save now.\nA")   # a sentence starts a line
    lines = [c[2].split("\n") for c in got]
    assert all(len(line) <= LINE_CHARS for ls in lines for line in ls) and all(len(ls) <= 2 for ls in lines)
    assert got[-2][1] == got[-2][0] + HOLD_S            # a long silence: the text goes after HOLD_S
    assert got[-1] == (30.0, 30.0 + HOLD_S, got[-2][2].split("\n")[-1] + "\n<b>&")
    assert parse(webvtt(words)) == [(a, b, t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
                                    for a, b, t in got]
    assert timestamp(3661.5) == "01:01:01.500" and timestamp(0.0004) == "00:00:00.000"


def test_a_path_that_cannot_be_written_fails_before_the_stream(server, tmp_path):  # noqa: F811
    r = cli("stream", "--url", server.url, "--vtt", str(tmp_path / "no" / "such" / "dir.vtt"), stdin="haus\n",
            SIMULSERVE_API_KEY=KEY)
    assert r.returncode == 2 and "dir.vtt" in r.stderr and r.stdout == ""


def test_stream_writes_the_words_as_they_arrived(server, sentences, reference, tmp_path):  # noqa: F811
    """A real server and client: --vtt beside --words; every word's arrival starts a cue ending in that word,
    and the last cue of each sentence holds its translation's last words. Paced (speaker's clock) and not."""
    lines, path = sentences
    for wpm in ("600", "0"):
        vtt = tmp_path / f"talk{wpm}.vtt"
        r = cli("stream", str(path), "--url", server.url, "--model", "waitk", "--k", "2", "--wpm", wpm, "--words",
                "--vtt", str(vtt), timeout=120, SIMULSERVE_API_KEY=KEY)
        assert r.returncode == 0, r.stderr
        got = [json.loads(line) for line in r.stdout.splitlines()]
        words = [m for m in got if m["type"] == "word"]
        assert words and all(m["received_s"] >= 0 for m in words)
        parsed = parse(vtt.read_text(encoding="utf-8"))
        at: dict[str, dict] = {}     # the last word that arrived at each (millisecond) time
        for w in words:
            at[timestamp(w["received_s"])] = w
        assert [timestamp(a) for a, _, _ in parsed] == list(at)      # a cue where words arrived, in order
        for (start, _, text), last in zip(parsed, at.values()):      # ...ending with the word that arrived then
            assert text.endswith(last["text"]) and text.split("\n")[-1] in " ".join(
                w["text"] for w in words if w["sentence"] == last["sentence"])
        for i, line in enumerate(lines):   # each sentence's last cue line ends its translation
            final = [t for (a, _, t), w in zip(parsed, at.values()) if w["sentence"] == i][-1]
            assert reference("waitk", {"k": 2}, line).prediction.endswith(final.split("\n")[-1])


@pytest.mark.browser
def test_chromium_reads_the_file_as_written(browser):  # noqa: F811
    """A real WebVTT parser (Chromium's, through a <track>) finds every cue with its times and text."""
    words = [word(0, t, 1.0 + 0.5 * i) for i, t in enumerate("Click Save to <save> & go on reading this".split())]
    words += [word(1, t, 9.0 + 0.25 * i) for i, t in enumerate("Second sentence, a longer one, over two lines "
                                                               "of text for the roll-up".split())]
    data = base64.b64encode(webvtt(words).encode()).decode()
    page = browser.new_page()
    try:
        page.set_content(f"""<!doctype html><video></video><script>
            const track = document.createElement("track");
            track.kind = "subtitles"; track.src = "data:text/vtt;base64,{data}";
            document.querySelector("video").appendChild(track);
            track.track.mode = "hidden";
            track.onload = () => {{ window.cues = Array.from(track.track.cues, (c) =>
                [c.startTime, c.endTime, Array.from(c.getCueAsHTML().childNodes, (n) => n.textContent).join("")]); }};
            track.onerror = () => {{ window.cues = "error"; }};
        </script>""")
        page.wait_for_function("window.cues !== undefined", timeout=10_000)
        got = page.evaluate("window.cues")
    finally:
        page.close()
    want = cues(words)
    assert got != "error" and len(got) == len(want)
    for (a, b, text), (x, y, t) in zip(got, want):
        assert a == pytest.approx(x, abs=1e-3) and b == pytest.approx(y, abs=1e-3) and text == t
