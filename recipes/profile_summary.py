"""Where a server process's time goes: a summary of a py-spy profile in raw form (`py-spy record --threads
-f raw`), as Markdown tables, one per thread: the functions that were on the stack in most samples (inclusive)
and those that were running themselves (self; native code is counted in the Python function that called it).

    python recipes/profile_summary.py engine_profile.txt [--top 25]

recipes/gpu/profile_engine.sh records such a profile of the engine process while `bench server` holds a level.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys

FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`function (path/file.py:123)` -> `function (file.py)`: lines of one function count together."""
    m = FRAME.match(frame.strip())
    return f"{m['fn']} ({m['file'].rsplit('/', 1)[-1]})" if m else frame.strip()


def read(path: str) -> tuple[dict[str, int], dict[str, collections.Counter], dict[str, collections.Counter]]:
    """Samples per thread, and per thread the inclusive and self samples of each function."""
    samples: dict[str, int] = collections.Counter()
    inclusive: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    own: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            thread = re.sub(r"^thread \(0?x?[0-9a-f]+\):?\s*", "", frames[0]).strip() or frames[0]
            samples[thread] += n
            names = [frame_name(f) for f in frames[1:]]
            for name in set(names):
                inclusive[thread][name] += n
            if names:
                own[thread][names[-1]] += n
    return samples, inclusive, own


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile", help="py-spy record --threads -f raw output")
    p.add_argument("--top", type=int, default=25, help="functions per table (default 25)")
    args = p.parse_args(argv)
    samples, inclusive, own = read(args.profile)
    total = sum(samples.values())
    if not total:
        print(f"{args.profile}: no samples")
        return 1
    print(f"{total} samples; per thread: " + ", ".join(f"{t} {n} ({n / total:.0%})" for t, n in samples.most_common()))
    for thread, n in samples.most_common():
        if n < 0.02 * total:
            continue
        for title, table in (("on the stack (inclusive)", inclusive[thread]), ("running itself (self)", own[thread])):
            print(f"\n{thread}: functions {title}, share of the thread's {n} samples")
            print("| share | function |\n|---:|---|")
            # (the trunk every sample shares, thread start-up and the event loop's runner, says nothing)
            rows = [(name, k) for name, k in table.most_common() if k < 0.98 * n or table is own[thread]]
            for name, k in rows[: args.top]:
                print(f"| {k / n:.1%} | {name} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
