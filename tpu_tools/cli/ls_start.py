"""`tpu-ls`'s console entry: on the plainest command lines the runtime child starts before the CLI is imported.

`tpu-ls` and `tpu-ls --json` list the devices with the default policy, so the child that imports jax can start
while click, the views and the readers are still being imported here (`pjrt.headstart`); the listing takes it
over, or kills it if the command turns out to need something else. Any other command line starts as before.
"""

from __future__ import annotations

import sys

# The command lines whose runtime query is known before the options are parsed: nothing but the output format.
_PLAIN: tuple[list[str], ...] = ([], ["--json"])


def main() -> None:
    if sys.argv[1:] in _PLAIN:
        from tpu_tools.pjrt import headstart, isolate, queries
        from tpu_tools.pjrt.runtime import RuntimePolicy

        headstart.start_ahead(queries.LIST_DEVICES, {"probe": False}, RuntimePolicy(), isolate.DEFAULT_TIMEOUT_S)
    from tpu_tools.cli.ls import main as list_devices

    list_devices()
