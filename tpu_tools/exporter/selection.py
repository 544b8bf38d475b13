"""Which families the exporter serves: allow and deny lists of family names with shell globs.

`tpu_tools_gpu_*` allows every GPU family; a name matches as it appears in a scrape (a counter with its
`_total`) or without it. With no allow list every family is allowed; the deny list wins over the allow list.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tpu_tools.errors import UsageError
from tpu_tools.shorten import quoted

GLOB = re.compile(r"^[A-Za-z0-9_:*?\[\]!]{1,200}$")
MAX_GLOBS = 1000


@dataclass(frozen=True)
class MetricSelection:
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    # one compiled expression per list: a scrape asks for every family, a list may be long
    _allow: re.Pattern[str] | None = field(init=False, repr=False, compare=False, default=None)
    _deny: re.Pattern[str] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_allow", _compile(self.allow))
        object.__setattr__(self, "_deny", _compile(self.deny))

    def selects(self, name: str) -> bool:
        """Whether the family `name` (as the client library names it, or as scraped) is served."""
        names = (name, name.removesuffix("_total"), name + "_total")
        if self._allow is not None and not any(self._allow.match(n) for n in names):
            return False
        return self._deny is None or not any(self._deny.match(n) for n in names)


def _compile(globs: Sequence[str]) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?:{fnmatch.translate(glob)})" for glob in globs)) if globs else None


def parse_globs(values: Iterable[str], where: str) -> tuple[str, ...]:
    """Globs from repeated options or a config list; each may hold several, comma-separated.

    Raises UsageError naming `where` for an empty or malformed glob.
    """
    globs: list[str] = []
    for value in values:
        for glob in (part.strip() for part in value.split(",")):
            if not GLOB.match(glob):
                # its repr cut, not the text: an escaped control character or code point takes up to ten
                shown = quoted(glob, 60)
                raise UsageError(f"{where}: {shown} is not a metric name or glob (letters, digits, _ : and "
                                 f"the wildcards * ? [ ])")
            globs.append(glob)
    if len(globs) > MAX_GLOBS:
        raise UsageError(f"{where}: more than {MAX_GLOBS} names")
    return tuple(globs)
