"""tpu-tools: runtime tools for accelerators driven through PJRT.

Importing this package is cheap on purpose: nothing here imports jax, so the
command-line front ends can start fast and decide how the runtime is set up
before jax is loaded.
"""

__version__ = "0.1.0"
