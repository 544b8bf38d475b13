"""Collective bandwidth and correctness: ops, sweep, exact checks, many processes (tpu-collectives-test)."""
