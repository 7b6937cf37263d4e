"""SimulEval agents and scorers, and the `evaluate` / `plot-alignment` commands.

SimulEval (the optional `eval` extra) is imported only where it is needed: when
SimulEval itself loads this package (`--user-dir agents`) or an agent module, the
CW scorer is registered; `simulserve evaluate` runs without importing it.
"""
import sys

if "simuleval" in sys.modules:
    from . import scorers  # noqa: F401
