"""Play the caption page's bundled demo and save a screenshot (headless Chromium, via Playwright).

    python docker/screenshot.py http://127.0.0.1:8000/ docs/caption_page_container.png

Waits until both panes say ready, presses ▶ Play (the bundled German demo text) at a brisk pace, lets
the captions run for --seconds, and saves the page. Needs the `playwright` package (the test extra)
and Chromium (`bash docker/install-browser.sh`; SIMULSERVE_CHROMIUM names another binary).
"""
from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("png")
    ap.add_argument("--seconds", type=float, default=12.0, help="how long the demo plays before the shot")
    ap.add_argument("--wpm", type=int, default=240, help="the player's pace (the page's slider)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright
    chromium = os.environ.get("SIMULSERVE_CHROMIUM", "/usr/bin/chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(args.url)
        for pane in ("a", "b"):
            page.wait_for_selector(f"#pane-{pane} .status[data-state=ready]", timeout=60_000)
        page.wait_for_function("document.querySelector('#script').value.length > 0")
        page.eval_on_selector("#wpm", "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                              str(args.wpm))
        page.click("#play")
        page.wait_for_timeout(args.seconds * 1000)
        page.screenshot(path=args.png, full_page=True)
        browser.close()
    print(f"screenshot.py: saved {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
