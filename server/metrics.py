"""Prometheus metrics of one server (GET /metrics).

Each app owns its registry, so several servers can live in one process (tests);
the registry includes the standard process metrics (resident memory, CPU time),
which the server benchmark reads for its soak test.
"""
from __future__ import annotations

import bisect
import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST, GCCollector, PlatformCollector, ProcessCollector

_MS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_QUEUE = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
          0.15, 0.2, 0.5, 1.0, 2.0, 5.0)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.active_streams = Gauge("simulserve_active_streams", "open websocket streams", registry=r)
        self.model_streams = Gauge("simulserve_model_streams", "started streams per model", ["model"], registry=r)
        self.cache_slots = Gauge("simulserve_cache_slots_in_use", "stream cache slots in use", ["model"],
                                 registry=r)
        self.cache_capacity = Gauge("simulserve_cache_slots_allocated", "stream cache slots whose memory is held "
                                    "(in use or free; shrinks when they stay unused)", ["model"], registry=r)
        self.models_loaded = Gauge("simulserve_models_loaded", "models loaded and serving", registry=r)
        self.words_in = Counter("simulserve_source_words", "source words received", ["model"], registry=r)
        self.words_out = Counter("simulserve_target_words", "target words emitted", ["model"], registry=r)
        self.sentences = Counter("simulserve_sentences", "sentences translated", ["model"], registry=r)
        self.batch_size = Histogram("simulserve_batch_size", "streams per batched step", ["model"],
                                    buckets=_BATCH, registry=r)
        self.step_seconds = Histogram("simulserve_step_seconds", "compute time of one batched step (worker "
                                      "thread)", ["model"], buckets=_MS, registry=r)
        self.batch_wait_seconds = Histogram("simulserve_batch_wait_seconds", "time spent in the batching "
                                            "window before a step", ["model"], buckets=_MS, registry=r)
        self.queue_seconds = Histogram("simulserve_queue_seconds", "from a stream having something to do "
                                       "(input arrived, or its last step left it able to move on) to the start "
                                       "of the job that steps it", ["model"], buckets=_QUEUE, registry=r)
        self.word_lag_seconds = Histogram("simulserve_word_lag_seconds", "from the arrival of the input a target "
                                          "word needed to its emission (queueing + compute)", ["model"],
                                          buckets=_MS, registry=r)
        # admission by headroom (server/admission.py), refreshed a few times a second
        self.headroom_streams = Gauge("simulserve_headroom_streams", "more streams the model can take while its "
                                      "p99 added delay stays within the budget (0: new streams get server_busy)",
                                      ["model"], registry=r)
        self.capacity_streams = Gauge("simulserve_capacity_streams", "live streams the model can keep within the "
                                      "delay budget, as estimated from its measurements", ["model"], registry=r)
        self.live_streams = Gauge("simulserve_live_streams", "streams holding a share of the capacity (input "
                                  "lately, or just admitted)", ["model"], registry=r)
        self.recent_delay_p99 = Gauge("simulserve_recent_delay_p99_seconds", "p99 word lag plus p99 event-loop "
                                      "lateness over the last seconds (-1: too few words)", ["model"], registry=r)
        self.errors = Counter("simulserve_errors", "errors sent to clients, by code", ["code"], registry=r)
        self.refusals = Counter("simulserve_refusals", "connections refused or closed by a guard, by reason "
                                "(ip_connections, ip_auth_failures, start_timeout, header_too_large, "
                                "too_many_headers, head_timeout, ping_flood, invalid_utf8)", ["reason"], registry=r)
        self.ip_connections = Gauge("simulserve_client_addresses", "client addresses with an open websocket",
                                    registry=r)
        self.warnings = Counter("simulserve_warnings", "warnings sent to clients, by code", ["code"], registry=r)
        self.sentence_ends = Counter("simulserve_sentence_ends", "sentences ended, by cause: auto_segment's punct, "
                                     "boundary (the classifier), words and positions (the limits); end (the "
                                     "client's end_sentence or end_stream), pause (end_after_pause_s), idle (the "
                                     "idle timeout's flush)", ["cause"], registry=r)
        self.viewers = Gauge("simulserve_viewers", "open viewer responses of shared captions (/watch/TOKEN/events)",
                             registry=r)
        self.shared_feeds = Gauge("simulserve_shared_feeds", "shared caption feeds, live or waiting for their "
                                  "speaker (start's share)", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def observe_many(child, values: list[float]) -> None:
    """Observe every value on a histogram child (`Histogram.labels(...)`) at once: the same bucket counts as one
    `observe` a value, and the same sum up to float rounding, with one locked update a bucket hit instead of two
    a value (prometheus_client's observe also walks the buckets in Python). The engine observes each job's
    queue waits (one a stream) and word lags (one a word) this way, on the threads the step shares the
    interpreter with. It reads the child's bucket values, which tests/test_metrics.py holds to observe's."""
    if not values:
        return
    bounds = child._upper_bounds
    counts = [0] * len(bounds)
    for v in values:
        i = bisect.bisect_left(bounds, v)   # the first bound >= v, as observe's `v <= bound` (+Inf last)
        if v <= bounds[i]:                  # (NaN: no bucket, as observe; bisect would say the first)
            counts[i] += 1
    child._sum.inc(math.fsum(values))
    for i, n in enumerate(counts):
        if n:
            child._buckets[i].inc(n)
