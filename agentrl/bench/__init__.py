"""What the benchmarks in `jobs/bench_*.py` measure, as functions the entry points and tests call."""
