"""What a line goes through before the detectors see it: the decoration logs pick up on the
way to us, taken off.

Logs reach triage as files written by the program, but also copied out of terminals (ANSI
colours), pasted into issues and chat (markdown quotes), and saved on Windows (CRLF). Taking
that off once here keeps every detector's patterns about the program's own text. Timestamps and
``[rank3]:`` prefixes are kept: detectors read the rank and the time from them.
"""

from __future__ import annotations

import re

# ECMA-48 control sequences (colours, cursor moves): ESC [ parameters intermediates final.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
# Markdown block quotes, nested or not ("> > text").
_QUOTE = re.compile(r"^(?:[ \t]*>)+[ \t]?")


def clean(line: str) -> str:
    """``line`` without its trailing CR, ANSI control sequences and markdown quote markers."""
    line = line.rstrip("\r")
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if ">" in line[:8]:
        line = _QUOTE.sub("", line)
    return line
