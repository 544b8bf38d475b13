"""Where command output goes and in which form: JSON, rich (terminal) or plain text."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

from tpu_tools import jsonout
from tpu_tools.parsing import terminal_size
from tpu_tools.render.table import TableData, plain_table, rich_table
from tpu_tools.sanitize import safe_text

FORMAT_CHOICES = ("auto", "table", "plain", "json")


def wants_color(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR")


def resolve_format(requested: str, json_flag: bool, stream: TextIO) -> str:
    """'json', 'rich' or 'plain'. `auto` picks rich on a colour terminal, plain otherwise."""
    if json_flag or requested == "json":
        return "json"
    if requested == "table":
        return "rich"
    if requested == "plain":
        return "plain"
    return "rich" if wants_color(stream) else "plain"


@dataclass
class Output:
    format: str  # "json", "rich" or "plain"
    stream: TextIO = sys.stdout

    @property
    def is_json(self) -> bool:
        return self.format == "json"

    def json(self, document: Any) -> None:
        json_written()
        self.stream.write(jsonout.dumps(document) + "\n")
        self.stream.flush()

    def json_line(self, document: Any) -> None:
        json_written()
        self.stream.write(jsonout.dumps(document, compact=True) + "\n")
        self.stream.flush()

    def text(self, text: str = "") -> None:
        self.stream.write(safe_text(text, multiline=True) + "\n")
        self.stream.flush()

    def blocks(self, blocks: Iterable[str | TableData]) -> None:
        """A report of text blocks and tables, a blank line between each."""
        for index, block in enumerate(blocks):
            if index:
                self.text("")
            if isinstance(block, str):
                self.text(block)
            else:
                self.table(block)

    def table(self, table: TableData) -> None:
        if self.format == "rich":
            self.rich(rich_table(table, self.console().width))
        else:
            self.text(plain_table(table))

    def rich(self, renderable: Any) -> None:
        console = self.console()
        console.print(renderable)

    def console(self):
        # Box-drawn layout whenever asked for; colour only on a terminal without NO_COLOR.
        return console_on(self.stream, force_terminal=self.stream.isatty(), no_color=not wants_color(self.stream),
                          highlight=False)


def console_on(stream: TextIO, **options: Any) -> Any:
    """A rich Console on `stream` sized by `parsing.terminal_size`: rich would read COLUMNS and LINES itself,
    unbounded, and raise on digits that are not ASCII."""
    from rich.console import Console

    try:
        fd: int | None = stream.fileno()
    except (OSError, ValueError, AttributeError):
        fd = None
    size = terminal_size(fd)
    return Console(file=stream, width=size.columns, height=size.lines, **options)


@dataclass
class JsonAnswer:
    """A program asked for JSON on stdout writes one document on every exit, a failure's included: `schema` is
    the document's when JSON was asked for, `written` whether a document went out already."""

    schema: str | None = None
    written: bool = False


_json_answer = JsonAnswer()


def expect_json(schema: str) -> None:
    """The running command was asked for a JSON document of `schema` on stdout."""
    _json_answer.schema = schema


def json_written() -> None:
    """A JSON document went to stdout: a failure after it adds no second one."""
    _json_answer.written = True


def error_document(message: str, exit_code: int) -> dict[str, Any] | None:
    """The document a failure writes when JSON was asked for and none was written yet, else None.

    It has the schema of the document the command would have written, `error` (the sentence also shown on
    stderr) and `exit_code`, as a failed collectives run's document has.
    """
    if _json_answer.schema is None or _json_answer.written:
        return None
    return {"schema": _json_answer.schema, "error": message, "exit_code": exit_code}


def note(message: str) -> None:
    """A line for the user on stderr (never mixed into stdout's data)."""
    sys.stderr.write(safe_text(message, multiline=True) + "\n")
    sys.stderr.flush()


def reserve_stdout() -> None:
    """Keep stdout for our report: native code (gloo) prints on file descriptor 1, which goes to stderr from now."""
    try:
        sys.stdout.flush()
        ours = os.dup(sys.stdout.fileno())
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptors (embedded): nothing to protect
        return
    sys.stdout = os.fdopen(ours, "w", buffering=1, encoding=sys.stdout.encoding, errors="replace")
