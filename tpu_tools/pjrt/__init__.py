"""The PJRT client layer shared by every command.

Modules here never print. `runtime` decides how jax is set up before it is
imported; `isolate` and `child` run read-only runtime queries in a separate
process; `discover` reads sysfs/dev/proc without opening any device.
"""
