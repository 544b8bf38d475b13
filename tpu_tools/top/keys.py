"""tpu-top's keys: one table of key, action and help. `handle_key` dispatches through it, the help screen lists
it, and the man page's KEYS section and docs/top-screen.md's key table are generated from it
(tools/gen_docs.py), so a key cannot do one thing and be documented as another."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from tpu_tools.top.model import SORT_COLUMNS, Pending, ProcessRow, ViewState

QUIT = "quit"
REDRAW = "redraw"
IGNORED = "ignored"

# A signaller sends a signal to a row's process and returns (delivered, what to tell the user).
Signaller = Callable[[ProcessRow, str], tuple[bool, str]]
# A checker says why a row's process may not be signalled, or None when it may.
Checker = Callable[[ProcessRow], "str | None"]

SIGNAL_KEYS = {"I": "SIGINT", "T": "SIGTERM", "K": "SIGKILL"}
ENTER_KEYS = ("enter", "\n", "\r")
BACK_KEYS = ("backspace", "\x7f", "left")  # besides Esc, these leave the job screen
ENVIRONMENT_PAGE = 10
WHEEL_LINES = 3  # one wheel notch moves the selection (or scrolls the environment) this far
PAGE_ROWS = 10  # PgUp / PgDn move the selection this far
CLICK = "click"  # the mouse's "click:LINE" keys are looked up under this name


@dataclass(frozen=True)
class KeyPress:
    """What an action gets: the state, the key as it came, the process rows as shown (sorted), and the
    refusal check for signals."""

    state: ViewState
    key: str
    rows: list[ProcessRow]
    checker: Checker | None

    def job_or_selected(self) -> ProcessRow | None:
        """The job screen's process where one is open, else the selected row."""
        if self.state.job_key is not None:
            return next((r for r in self.rows if r.key == self.state.job_key), None)
        return self.state.selected_row(self.rows)


Action = Callable[[KeyPress], str]


@dataclass(frozen=True)
class Binding:
    keys: tuple[str, ...]  # the names handle_key receives
    label: str  # how the help, the man page and the docs write the keys
    help: str  # the help screen's words (wrapped to its width)
    doc: str  # the man page's and docs/top-screen.md's fuller sentence
    action: Action


def _changed(change: Callable[[ViewState], object]) -> Action:
    """An action that changes the state and redraws."""
    def act(press: KeyPress) -> str:
        change(press.state)
        return REDRAW
    return act


def _move(delta: Callable[[KeyPress], int]) -> Action:
    def act(press: KeyPress) -> str:
        press.state.move(press.rows, delta(press))
        return REDRAW
    return act


def _quit(press: KeyPress) -> str:
    return QUIT


def _step(press: KeyPress) -> int:
    return -1 if press.key in ("up", "k") else 1


def _page(press: KeyPress) -> int:
    return -PAGE_ROWS if press.key == "pageup" else PAGE_ROWS


def _far(press: KeyPress) -> int:
    return -len(press.rows) if press.key == "home" else len(press.rows)


def _mouse(press: KeyPress) -> str:
    """A click on a process row selects it; the wheel moves the selection (on the process list only)."""
    state = press.state
    if state.job_key is not None:
        return IGNORED
    if press.key in ("wheelup", "wheeldown"):
        state.move(press.rows, WHEEL_LINES if press.key == "wheeldown" else -WHEEL_LINES)
        return REDRAW
    line = press.key.partition(":")[2]
    clicked = state.row_at.get(int(line)) if line.isdigit() else None
    if clicked is None:
        return IGNORED
    state.selected_key = clicked
    state.resolve_selection(press.rows)
    return REDRAW


def _open_job(press: KeyPress) -> str:
    row = press.state.selected_row(press.rows)
    if row is not None:
        press.state.job_key = row.key
    return REDRAW


def _ask_arrays(press: KeyPress) -> str:
    """`m` on a job screen: read that job's arrays once, in the background (the keys never wait for it)."""
    state = press.state
    if state.job_key is None:
        return IGNORED
    row = press.job_or_selected()
    if row is None:
        state.say("the process is gone: nothing to ask", error=True)
    elif not row.has_agent:
        state.say(f"{row.pid} has no tpu-tools agent: its arrays cannot be read", error=True)
    elif row.host is not None:
        state.say(f"{row.pid} runs on {row.host}: only this host's agents can be asked", error=True)
    elif row.error:
        state.say(f"the agent of {row.pid} does not answer: {row.error}", error=True)
    elif not state.arrays.ask(row.key, row.pid):
        state.say(f"still reading the arrays of {row.pid}")
    return REDRAW


def _open_environment(press: KeyPress) -> str:
    state = press.state
    row = press.job_or_selected()
    if row is None or state.read_environment is None:
        state.say("no process selected" if row is None else "no environment screen here", error=True)
    else:
        state.environment = state.read_environment(row)
    return REDRAW


def _escape(press: KeyPress) -> str:
    """Esc: leave the job screen, else clear the filter, else the marks."""
    state = press.state
    if state.job_key is not None:
        state.job_key = None
    elif state.filters.text:
        state.filters.text = ""
    elif state.marked:
        state.marked.clear()
    else:
        return IGNORED
    return REDRAW


def _back(press: KeyPress) -> str:
    if press.state.job_key is None:
        return IGNORED
    press.state.job_key = None
    return REDRAW


def _start_filter(state: ViewState) -> None:
    state.editing_filter = True


def _toggle_all(state: ViewState) -> None:
    state.filters.show_all = not state.filters.show_all


def _mark(press: KeyPress) -> str:
    state = press.state
    row = state.selected_row(press.rows)
    if row is not None:
        state.marked ^= {row.key}
        state.move(press.rows, 1)  # as in top and htop: mark down a list key by key
    return REDRAW


def _ask_signal(press: KeyPress) -> str:
    """I/T/K: ask to signal the job screen's process, else the marked processes, else the selected one."""
    state, checker = press.state, press.checker
    if state.readonly:
        state.say("read-only (--readonly): tpu-top sends no signals", error=True)
        return REDRAW
    signal_name = SIGNAL_KEYS[press.key]
    marked = [r for r in press.rows if r.key in state.marked] if state.job_key is None else []
    if marked:
        allowed: list[ProcessRow] = []
        refused: list[str] = []
        for each in marked:
            reason = checker(each) if checker is not None else None
            if reason:
                refused.append(reason)
            else:
                allowed.append(each)
        if not allowed:
            state.say(refused[0] + (f" (+{len(refused) - 1} more)" if len(refused) > 1 else ""), error=True)
        else:
            state.pending = Pending(signal_name, allowed[0], allowed, refused)
        return REDRAW
    row = press.job_or_selected()
    if row is None:
        state.say("no process selected", error=True)
        return REDRAW
    refusal = checker(row) if checker is not None else None
    if refusal:
        state.say(refusal, error=True)
    else:
        state.pending = Pending(signal_name, row)
    return REDRAW


def _sort(press: KeyPress) -> str:
    state = press.state
    state.sort_index = (state.sort_index + (1 if press.key == "s" else -1)) % len(SORT_COLUMNS)
    return REDRAW


def _reverse(state: ViewState) -> None:
    state.reversed = not state.reversed


def _toggle_tree(state: ViewState) -> None:
    state.tree = not state.tree


def _pause(state: ViewState) -> None:
    state.paused = not state.paused


def _show_help(state: ViewState) -> None:
    state.show_help = True


_COLUMNS = ", ".join(c.header for c in SORT_COLUMNS)

KEYS = (
    Binding(("q",), "q", "quit",
            "quit (Ctrl-C and SIGTERM too; the terminal is restored in every case)", _quit),
    Binding(("up", "k", "down", "j"), "up/down j/k", "select a process", "select a process", _move(_step)),
    Binding(("pageup", "pagedown"), "PgUp/PgDn", "move the selection by 10",
            f"move the selection by {PAGE_ROWS}", _move(_page)),
    Binding(("home", "end"), "Home/End", "select the first / last process",
            "select the first or the last process", _move(_far)),
    Binding((CLICK, "wheelup", "wheeldown"), "mouse", "a click selects, the wheel scrolls",
            f"a click on a process row selects it, the wheel moves the selection by {WHEEL_LINES} (scrolls the "
            "environment screen); where the terminal reports no mouse, the keys do it all (tpu-top takes the "
            "mouse: Shift+drag still selects text in most terminals)", _mouse),
    Binding(ENTER_KEYS, "Enter", "the selected job's own screen",
            "the selected job's own screen; Esc (or Backspace, left) goes back", _open_job),
    Binding(("m",), "m", "job screen: read its largest arrays once",
            "on a job screen: read the job's largest live arrays once, in the background", _ask_arrays),
    Binding(("e",), "e", "the selected process's environment",
            "the selected process's environment (/proc/PID/environ, read once when the screen opens), one "
            "VAR=value a line sorted by name, with tpu-dump's redaction: the value of a secret-named variable "
            "(*TOKEN*, *KEY*, *PASS*, ...), credentials in URLs, bearer tokens and random-looking strings show "
            "as <redacted>. Another user's process says its environment is not readable (only its owner or root "
            "may read it). up/down, PgUp/PgDn, Home/End scroll; Esc goes back", _open_environment),
    Binding(("escape",), "Esc", "back (job screen), clear filter / marks",
            "leave the job screen; on the process list, clear the filter, else the marks", _escape),
    Binding(BACK_KEYS, "Backspace/left", "back (job screen)", "leave the job screen", _back),
    Binding(("/",), "/", "filter processes by text",
            "filter the processes by text (tag, user, command, PID, host): type, then Enter to keep the filter "
            "or Esc to clear it", _changed(_start_filter)),
    Binding(("a",), "a", "show / hide processes without agent",
            "show or hide the processes without an agent (device holders)", _changed(_toggle_all)),
    Binding((" ",), "space", "mark / unmark the process (Esc clears)",
            "mark / unmark the selected process (a * before its PID) and move down; Esc clears the marks; a "
            "mark goes when its process leaves the list", _mark),
    Binding(tuple(SIGNAL_KEYS), "I / T / K",
            "send SIGINT / SIGTERM / SIGKILL to the marked processes, else the selected one",
            "send SIGINT / SIGTERM / SIGKILL to the marked processes, else the selected one (or the job of the "
            "job screen), after y on the confirmation line (one y for all; any other key cancels). A process you "
            "may not signal (another user's, unless you are root; one on another host) is refused with a "
            "message, and left out and counted among marked ones; tpu-top --readonly sends none and says so. "
            "The result is shown on the bottom line", _ask_signal),
    Binding(("s", "S"), "s / S", "sort by the next / previous column",
            f"sort by the next / previous column: {_COLUMNS}", _sort),
    Binding(("r",), "r", "reverse the sort order", "reverse the sort order", _changed(_reverse)),
    Binding(("t",), "t", "tree: children under their parent",
            "tree view: each process under its parent among the listed processes (indented), siblings in the "
            "sort order; a process whose parent is not listed stays at the top level", _changed(_toggle_tree)),
    Binding(("p",), "p", "pause / resume refreshing",
            "pause or resume refreshing (no report is gathered while paused)", _changed(_pause)),
    Binding(("h", "?"), "h or ?", "this help (any key closes it)",
            "show the keys; any key closes them (q also quits)", _changed(_show_help)),
)
BY_KEY = {key: binding for binding in KEYS for key in binding.keys}

HELP_TITLE = "tpu-top keys"
_HELP_WIDTH = 42  # the words' column, so that the box fits an 80-column terminal


def help_lines() -> tuple[str, ...]:
    """The help screen: each binding's label and its words, wrapped under the words' column."""
    width = max(len(binding.label) for binding in KEYS)
    lines = [HELP_TITLE, ""]
    for binding in KEYS:
        wrapped = textwrap.wrap(binding.help, _HELP_WIDTH)
        lines.append(f"  {binding.label:<{width}}  {wrapped[0]}")
        lines += [" " * (width + 4) + more for more in wrapped[1:]]
    return tuple(lines)


def man_text() -> str:
    """The man page's KEYS section: one paragraph per binding."""
    return "\n".join(f"{binding.label}  {binding.doc}." for binding in KEYS)


def markdown_table() -> str:
    """docs/top-screen.md's key table."""
    def escaped(text: str) -> str:  # the docs say *TOKEN* and <redacted> as the screen does
        return text.replace("*", "\\*").replace("<", "&lt;").replace("|", "\\|")

    rows = [f"| {escaped(binding.label)} | {escaped(binding.doc)} |" for binding in KEYS]
    return "\n".join(["| key | what it does |", "| --- | --- |", *rows])


def _edit_filter(state: ViewState, key: str) -> str:
    if key in ENTER_KEYS:
        state.editing_filter = False
    elif key == "escape":
        state.editing_filter = False
        state.filters.text = ""
    elif key in ("backspace", "\x7f", "\x08"):
        state.filters.text = state.filters.text[:-1]
    elif len(key) == 1 and key.isprintable():
        state.filters.text += key
    else:
        return IGNORED
    return REDRAW


def _answer_pending(state: ViewState, key: str, signaller: Signaller | None) -> str:
    pending, state.pending = state.pending, None
    assert pending is not None
    if key not in ("y", "Y") or signaller is None:
        state.say(f"{pending.signal_name} not sent")
        return REDRAW
    if not pending.rows:
        delivered, text = signaller(pending.row, pending.signal_name)
        state.say(text, error=not delivered)
        return REDRAW
    results = [signaller(row, pending.signal_name) for row in pending.rows]
    failures = [text for delivered, text in results if not delivered] + pending.refused
    sent = len(results) - sum(1 for delivered, _ in results if not delivered)
    state.marked.clear()
    state.say(f"{pending.signal_name} sent to {sent} of {sent + len(failures)} marked processes"
              + (f"; {failures[0]}" + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else "")
                 if failures else ""), error=bool(failures))
    return REDRAW


def _environment_key(state: ViewState, key: str) -> str:
    """Keys on the environment screen: Esc (or e, left, backspace) goes back, the others scroll."""
    env = state.environment
    assert env is not None
    if key in ("escape", "e", *BACK_KEYS):
        state.environment = None
        return REDRAW
    moves = {"up": -1, "k": -1, "down": 1, "j": 1, "wheelup": -WHEEL_LINES, "wheeldown": WHEEL_LINES,
             "pageup": -ENVIRONMENT_PAGE, "pagedown": ENVIRONMENT_PAGE,
             "home": -len(env.lines), "end": len(env.lines)}
    if key not in moves:
        return IGNORED
    env.top = max(0, min(len(env.lines) - 1, env.top + moves[key]))  # the screen clamps it to its height
    return REDRAW


def handle_key(state: ViewState, key: str, rows: list[ProcessRow], signaller: Signaller | None = None,
               checker: Checker | None = None) -> str:
    """Apply one key (a character, or "up"/"down"/"home"/"end"/"pageup"/"pagedown"/"enter"/"escape"/
    "backspace", or the mouse's "click:LINE"/"wheelup"/"wheeldown") to the state. `rows` are the process
    panel's rows as shown (filtered); `signaller` sends the signal confirmed with `y`, `checker` refuses one
    before asking. The modes (the help, the filter being typed, a signal to confirm, the environment screen)
    take the key first; otherwise KEYS says what it does."""
    if state.show_help:
        state.show_help = False  # any key closes the help; q also quits
        return QUIT if key == "q" else REDRAW
    if state.editing_filter:
        return _edit_filter(state, key)
    if state.pending is not None:
        return _answer_pending(state, key, signaller)
    ordered = state.sorted_rows(rows)
    state.marked &= {r.key for r in ordered}  # a mark goes with its process (gone, or filtered out)
    if state.environment is not None and key != "q":
        return _environment_key(state, key)
    binding = BY_KEY.get(CLICK if key.startswith(CLICK + ":") else key)
    if binding is None:
        return IGNORED
    return binding.action(KeyPress(state, key, ordered, checker))
