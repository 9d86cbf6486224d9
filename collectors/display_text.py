"""Text from outside shown to a person: no control or format character reaches a terminal or a chat raw.

A run name in ``run.json``, a TensorBoard tag, a request's reason, a file name quoted in an error: whoever
wrote them can put escape sequences in (OSC 0 retitles the terminal, OSC 52 writes its clipboard, CSI moves
the cursor and erases lines to hide or fake output), a newline that forges a line, or a right-to-left
override that disguises what follows. ``visible`` shows each such character as its Python escape
(``\\x1b``, ``\\n``, ``\\u202e``), so it is seen, never obeyed; ``hidden_characters`` names them for the
checks that refuse them outright (an operator's name, a request's reason).
"""

from __future__ import annotations

import re
import unicodedata

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories never shown raw: controls (C0, DEL, C1), format characters (bidi overrides and
isolates, zero-width characters), lone surrogates, line and paragraph separators."""
_NOT_PLAIN_ASCII = re.compile(r"[^\x20-\x7e]")


def is_hidden(character: str) -> bool:
    """Whether ``character`` acts on the display (or is invisible) rather than being a visible character."""
    return unicodedata.category(character) in HIDDEN_CATEGORIES


def visible(text: str) -> str:
    """``text`` with every hidden character written as its escape; other text, any script, unchanged."""
    return _NOT_PLAIN_ASCII.sub(_escape, text)


def hidden_characters(text: str) -> list[str]:
    """The hidden characters in ``text`` as ``U+XXXX``, sorted and each once (empty when there are none)."""
    return sorted({f"U+{ord(c):04X}" for c in text if is_hidden(c)})


def _escape(match: re.Match[str]) -> str:
    character = match.group()
    return character.encode("unicode_escape").decode("ascii") if is_hidden(character) else character
