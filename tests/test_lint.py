"""The style .flake8 sets, checked on every run so the tree stays clean."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_tree_passes_flake8():
    if importlib.util.find_spec("flake8") is None:
        pytest.skip("flake8 is not installed (it comes with the test extras: pip install -e .[test])")
    out = subprocess.run([sys.executable, "-m", "flake8", "server", "models", "agents", "clients", "recipes", "tests"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
