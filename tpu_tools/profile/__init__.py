"""Profiling JAX programs: trace capture, trace reading, compile records, summaries, HLO analysis.

Nothing here prints; the CLI (`tpu_tools.cli.profile`) renders what these modules return.
Modules that need jax import it inside functions, after the runtime policy is applied.
"""
