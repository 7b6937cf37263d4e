"""Benchmarks of the streaming step and the engine (`simulserve bench ...`)."""
