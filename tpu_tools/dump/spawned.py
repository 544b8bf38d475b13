"""A collector's child as a fresh interpreter, for callers that must not fork (they run other threads).

stdin carries the pickled (collector, options, redactor); file descriptor 3 is the result pipe, framed as the
forked child frames it (`runner.child_main`).
"""

from __future__ import annotations

import os
import pickle
import sys

from tpu_tools.dump.runner import child_main

RESULT_FD = 3


def main() -> None:
    try:
        collector, options, redactor = pickle.load(sys.stdin.buffer)
    except BaseException:  # noqa: BLE001 a child with no collector to run exits at once
        os._exit(1)
    child_main(collector, options, redactor, RESULT_FD)


if __name__ == "__main__":
    main()
