"""The benchmarks: scripts that print JSON (see each one's docstring). Most run as ``python bench/x.py``; the
ones that use a test double run as modules from the repository root (``python -m bench.agent_bench``,
``python -m bench.endpoint_bench``), where ``tests.doubles`` imports."""
