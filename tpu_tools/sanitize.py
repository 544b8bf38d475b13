"""The one sanitiser for text that reaches a terminal: nothing from outside may drive it.

Command lines of other users' processes, libtpu's host names and error messages, function names in
traces, member names in bundles: any of these can carry escape sequences (retitle or clear the
terminal, fake a prompt, write hyperlinks) or bidirectional overrides that make text read differently
from what it is. `safe_text` shows every such character as a visible escape (`\\x1b`, `\\u202e`):

- C0 controls and DEL (ESC starts every escape sequence), and C1 controls U+0080-U+009F (U+009B is a
  one-byte CSI to terminals that honour 8-bit controls);
- bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069) and marks (U+200E, U+200F,
  U+061C); zero-width and other invisible format characters (Unicode category Cf);
- line and paragraph separators (U+2028, U+2029) and lone surrogates (undecodable bytes).

Newlines and tabs are kept only where the text is multi-line by nature (`multiline=True`).
The output layer (cli.output, render.table) applies it to everything it writes; a base module, so that
tpu-top's curses screen and the views share it.
"""

from __future__ import annotations

import re

# Every code point of categories Cc, Cf, Zl, Zp and Cs (Unicode 15), as ranges; a test checks the list
# against unicodedata so that a new Python cannot silently widen the gap.
_UNSAFE_RANGES = (
    "\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
_UNSAFE = re.compile(f"[{_UNSAFE_RANGES}]")
_UNSAFE_KEEP_LINES = re.compile(f"[{_UNSAFE_RANGES.replace(chr(0) + '-' + chr(0x1f), chr(0) + '-' + chr(8))}"
                                "\x0b-\x1f]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe_text(value: object, *, multiline: bool = False) -> str:
    """`value` as text a terminal shows literally: unsafe characters written as visible escapes."""
    text = "" if value is None else value if isinstance(value, str) else str(value)
    return (_UNSAFE_KEEP_LINES if multiline else _UNSAFE).sub(_escape, text)


def is_safe(text: str, *, multiline: bool = False) -> bool:
    return not (_UNSAFE_KEEP_LINES if multiline else _UNSAFE).search(text)
