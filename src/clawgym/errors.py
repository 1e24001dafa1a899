"""The one exception type for mistakes a user can fix (bad input, wrong paths, bad configs).

The CLI prints such an error as one line and exits 1; anything else is a bug and shows a traceback.
`did_you_mean` adds the closest known name to an "unknown key" message.
"""

from __future__ import annotations

import difflib
from typing import Iterable


class UserError(Exception):
    """A problem with the user's input; the message says what was wrong and where."""


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """" (did you mean 'lr'?)" for the closest of `known` to a mistyped `word`, or "" when none is close."""
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
