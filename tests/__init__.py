"""The test suite. A package so that its shared helpers import as ``tests.doubles`` from any test folder
(pytest puts the repository root on ``sys.path`` for this package's conftest) and from the benchmarks run
as ``python -m bench.<name>``. The test folders themselves are not packages: their modules keep plain,
unique names."""
