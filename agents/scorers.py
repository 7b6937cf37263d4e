"""Latency scorers registered with SimulEval 1.1.4, computed by models/metrics/latency.py.

SimulEval has AL, LAAL, AP and DAL but no CW. Importing this module registers
"CW"; `simuleval ... --user-dir agents --latency-metrics AL CW` imports it through
the `agents` package before the metric names are checked (registering it inside
an `--agent` file is too late).
"""
from __future__ import annotations

from simuleval.evaluator.scorers.latency_scorer import LatencyScorer, register_latency_scorer

from models.metrics.latency import consecutive_wait


@register_latency_scorer("CW")
class CWScorer(LatencyScorer):
    """Consecutive Wait (Gu et al. 2017): mean source segment read between two writes.

    Usage: --user-dir agents --latency-metrics CW
    """

    def compute(self, ins) -> float:
        delays, _, _ = self.get_delays_lengths(ins)
        return consecutive_wait(delays)
