"""The collector's settings for a process that serves: applied once it has loaded, before it takes traffic.

- What loading made (models, tokenizers, imports: about 200,000 objects with gma_delta1) lives as long as the
  process: `gc.freeze()` moves it out of the collector's sight, so that a full collection takes ~0 ms instead of
  ~100 ms, a pause every stream felt.
- The young generation is collected after YOUNG_THRESHOLD net new container objects instead of Python's 700. A
  job of 256 streams makes and frees some thousands of lists, dicts and events; at 700 the surges alone set off
  about 60 collections a second flat out, whose survivors then fed the older generations' full collections
  (pauses up to 38 ms on the 2-core EPYC, 4-5 % of the time; docs/benchmarks.md, "The collector"). At
  10,000 the surges stay below it and a collection comes every few seconds or less often; the older
  generations' ratios are Python's.
"""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def settle(young: int = YOUNG_THRESHOLD) -> None:
    """Freeze what loading made and set the young generation's threshold (once loaded, on any thread)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(young, older, oldest)
