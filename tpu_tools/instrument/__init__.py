"""In-process instrumentation of a JAX program, shared by the agent and the profiler.

`compiles` follows JAX's compile events and cache-miss explanations (one
listener per process, whoever asked for it), `steps` counts the step
boundaries the program marks, and `jaxhook` runs code right after the program
imports jax. Nothing here imports jax by itself or prints.
"""
