"""The one exception type for mistakes a user can fix (bad input, wrong paths, bad configs).

The CLI prints such an error as one line and exits 1; anything else is a bug and shows a traceback.
"""


class UserError(Exception):
    """A problem with the user's input; the message says what was wrong and where."""
