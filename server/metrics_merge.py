"""One /metrics for the whole server when it runs as several processes (`simulserve serve --workers N`).

Each process keeps its own registry (server/metrics.py): the engine process the model and stream families, each
front end what happens on its websockets (errors and warnings sent, guard refusals) and its own `process_*`
figures. A scrape collects every process's samples at that moment and sums each series over the processes,
so a family appears once and a count is the server's: counters, histograms, stream gauges and
`process_resident_memory_bytes` (the server's memory) add up; creation and start times take the earliest;
`python_info`, `process_max_fds`, and what each of several engine processes (`--engines N`) reports for the
whole model (models loaded, the recent p99 delay) the largest.
"""
from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

EARLIEST = ("process_start_time_seconds",)
# (with --engines N each engine process sets these for all: the worst, not the sum)
LARGEST = ("process_max_fds", "python_info", "simulserve_models_loaded", "simulserve_recent_delay_p99_seconds")


def snapshot(registry) -> list[tuple]:
    """A registry's families as plain picklable tuples: (name, help, type, unit, [(sample, labels, value)])."""
    return [(m.name, m.documentation, m.type, m.unit, [(s.name, s.labels, s.value) for s in m.samples])
            for m in registry.collect()]


def merge(snapshots: list[list[tuple]]) -> list[Metric]:
    """The families of every snapshot, each series combined over the processes (see the module docstring)."""
    families: dict[str, tuple[Metric, dict]] = {}
    for snap in snapshots:
        for name, doc, typ, unit, samples in snap:
            if name not in families:
                families[name] = (Metric(name, doc, typ, unit), {})
            series = families[name][1]
            for sample, labels, value in samples:
                key = (sample, tuple(labels.items()))
                if key not in series:
                    series[key] = value
                elif sample.endswith("_created") or sample in EARLIEST:
                    series[key] = min(series[key], value)
                elif sample in LARGEST:
                    series[key] = max(series[key], value)
                else:
                    series[key] += value
    out = []
    for metric, series in families.values():
        metric.samples = [Sample(sample, dict(labels), value) for (sample, labels), value in series.items()]
        out.append(metric)
    return out


class Merged:
    """What `prometheus_client.generate_latest` renders: anything with collect()."""

    def __init__(self, snapshots: list[list[tuple]]):
        self.families = merge(snapshots)

    def collect(self):
        return iter(self.families)
