"""User-facing errors: one clear line, exit code 2, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input (file, row, field, option).

    The CLI prints ``str(error)`` as a single line and exits with code 2.
    """

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def require(condition: bool, message: str) -> None:
    """Raise :class:`UserError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise UserError(message)
