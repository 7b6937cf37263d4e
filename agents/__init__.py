"""SimulEval agents and scorers. Importing the package registers the CW scorer if SimulEval is installed."""
try:
    import simuleval  # noqa: F401
except ImportError:  # SimulEval is the optional `eval` extra
    pass
else:
    from . import scorers  # noqa: F401
