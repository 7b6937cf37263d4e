"""server/heap.py: once loaded, a server has what loading made out of the collector's sight and collects its
young generation after YOUNG_THRESHOLD new objects instead of Python's 700; `settle` does both, and keeps the
older generations' ratios."""
from __future__ import annotations

import gc

from test_server import LiveServer

from server.heap import YOUNG_THRESHOLD, settle


def test_settle_freezes_and_raises_only_the_young_threshold():
    before = gc.get_threshold()
    try:
        gc.unfreeze()
        keep = [[i] for i in range(1000)]   # objects alive now: frozen by settle
        settle(1234)
        assert gc.get_threshold() == (1234, before[1], before[2])
        assert gc.get_freeze_count() >= len(keep)
    finally:
        gc.set_threshold(*before)


def test_a_loaded_server_has_settled_its_heap(trained):
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, before[1], before[2])
        gc.unfreeze()
        with LiveServer(models={"waitk": str(trained["waitk"])}) as srv:   # (in this process)
            assert srv.app.state.server.ready
            assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*before)
