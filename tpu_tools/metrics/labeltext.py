"""Label values from outside (a job's tag, a pod's names, a command line), printable and bounded.

The sources that name a series by such a value (the GPU groups, the Kubernetes labels) and the exporter share
it, so a value is made safe once, the same way, wherever it is read.
"""

from __future__ import annotations

import re

from tpu_tools.shorten import shorten

MAX_LABEL_VALUE = 128  # characters of a label value that comes from outside (a tag, a pod name)
# control characters, line separators, and lone surrogates (valid in JSON, not encodable as UTF-8)
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def label_value(text: str) -> str:
    """A label value from outside, printable and bounded: control characters become "?", and a value longer
    than MAX_LABEL_VALUE is cut and ends in "..." (a 10 KiB tag must not make every series 10 KiB)."""
    text = _UNPRINTABLE.sub("?", text)
    return shorten(text, MAX_LABEL_VALUE)
