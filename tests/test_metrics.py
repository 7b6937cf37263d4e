"""server/metrics.py observe_many: a job's values into a histogram at once, as one observe a value would."""
from __future__ import annotations

import math
import random

from prometheus_client import CollectorRegistry, Histogram

from server.metrics import _MS, _QUEUE, observe_many


def _samples(registry: CollectorRegistry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for metric in registry.collect() for s in metric.samples if not s.name.endswith("_created")}


def test_observe_many_counts_what_observe_counts():
    """Random waits and lags (values exactly on a bound, 0, far past the last bound, NaN included), several
    batches and two label values: every bucket and count sample equal, the sums equal up to rounding."""
    rng = random.Random(7)
    for buckets in (_QUEUE, _MS):
        one, many = CollectorRegistry(), CollectorRegistry()
        h1 = Histogram("x_seconds", "x", ["model"], buckets=buckets, registry=one)
        h2 = Histogram("x_seconds", "x", ["model"], buckets=buckets, registry=many)
        for batch in range(30):
            model = "a" if batch % 3 else "b"
            values = [rng.expovariate(1 / 0.004) for _ in range(rng.randrange(0, 300))]
            values += rng.sample(list(buckets), 3) + [0.0, 50.0, float("nan")] * (batch % 2)
            for v in values:
                h1.labels(model).observe(v)
            observe_many(h2.labels(model), values)
        a, b = _samples(one), _samples(many)
        assert a.keys() == b.keys()
        for key in a:
            if key[0].endswith("_sum"):
                assert math.isnan(a[key]) == math.isnan(b[key])   # a NaN observed makes the sum NaN either way
                assert math.isnan(a[key]) or math.isclose(a[key], b[key], rel_tol=1e-12), key
            else:
                assert a[key] == b[key], key


def test_observe_many_of_nothing_changes_nothing():
    reg = CollectorRegistry()
    h = Histogram("y_seconds", "y", ["model"], buckets=_QUEUE, registry=reg)
    observe_many(h.labels("m"), [])
    assert all(v == 0 for k, v in _samples(reg).items())
