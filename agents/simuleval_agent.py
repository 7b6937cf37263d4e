"""SimulEval `--agent` launcher for simulserve checkpoints (any policy).

    simuleval --agent agents/simuleval_agent.py --user-dir agents \
        --checkpoint CKPT [--k K | --delta D] --source SRC --target REF \
        --latency-metrics AL CW AP DAL --quality-metrics BLEU --output DIR

SimulEval executes this file as a stand-alone module named `agents` (not the
project's package, and not registered in sys.modules), so it holds absolute
imports only and marks the class with `entrypoint`. If the project is neither
installed nor on PYTHONPATH nor imported by `--user-dir agents`, the repository
root (this file's grandparent) is put on sys.path.

Do not combine `--agent` with `--agent-class`: SimulEval 1.1.4 then ignores
`--agent-class` (a single marked class wins). For a policy-checking class use
`--agent-class agents.simul_agent.GMAAgent` (or `WaitKAgent`, `OfflineAgent`)
without `--agent`.
"""
import sys
from pathlib import Path

from simuleval.utils import entrypoint

try:
    from agents.simul_agent import SimulAgent
except ModuleNotFoundError as e:
    if e.name not in ("agents", "models"):
        raise
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agents.simul_agent import SimulAgent

entrypoint(SimulAgent)
