"""Reference workloads shared by the benchmarks and the profiler (no command-line code here)."""
