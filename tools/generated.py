"""How every generator (gen_docs, gen_dashboards, gen_proto) writes its files, or checks that they are current.

A generator gives the whole of its output as {path: content}. `--check` names the
checked-in files that differ from it, are missing, or sit in a folder the generator
owns without being generated any more; without it the files are written, each one
whole or not at all, and the leftovers in owned folders removed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
Files = dict[Path, "str | bytes"]


def spliced(path: Path, name: str, body: str) -> str:
    """The text of `path` with what stands between its `<!-- generated: NAME -->` and `<!-- end generated: NAME -->`
    lines replaced by `body`: a generated part of a hand-written document."""
    return spliced_text(path.read_text(), path, name, body)


def spliced_text(text: str, path: Path, name: str, body: str) -> str:
    """`text` (of `path`) with the part NAME replaced by `body`, as `spliced` does."""
    start, end = f"<!-- generated: {name} -->", f"<!-- end generated: {name} -->"
    before, found, rest = text.partition(start + "\n")
    _, found_end, after = rest.partition(end + "\n")
    if not found or not found_end:
        raise SystemExit(f"{path.relative_to(REPO)} lacks the lines {start} and {end}")
    return f"{before}{start}\n{body.rstrip()}\n{end}\n{after}"


def _current(path: Path, content: str | bytes) -> bool:
    if not path.exists():
        return False
    return (path.read_bytes() if isinstance(content, bytes) else path.read_text()) == content


def stale(files: Files, owned: Iterable[Path] = ()) -> list[Path]:
    """Generated paths whose checked-in file is missing or different, then files of `owned` folders not generated."""
    out = [path for path, content in files.items() if not _current(path, content)]
    return out + [path for folder in owned for path in sorted(folder.glob("*")) if path not in files]


def write(files: Files, owned: Iterable[Path] = ()) -> None:
    """Write every file atomically; remove what `owned` folders hold that is no longer generated."""
    sys.path.insert(0, str(REPO))
    from tpu_tools.atomic import write_file  # here: --check needs no import of the package

    for folder in owned:
        for path in folder.glob("*"):
            if path not in files:
                path.unlink()
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, content, force=True, what=str(path.relative_to(REPO)))


def main(description: str, generate: Callable[[], Files], owned: Iterable[Path] = ()) -> int:
    """The command line of a generator: write the files, or with --check exit 1 naming the stale ones."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="name the stale files and exit 1, writing nothing")
    args = parser.parse_args()
    owned = list(owned)
    if args.check:
        found = stale(generate(), owned)
        for path in found:
            print(f"stale: {path.relative_to(REPO)}")
        return 1 if found else 0
    files = generate()
    write(files, owned)
    print(f"wrote {len(files)} files")
    return 0
