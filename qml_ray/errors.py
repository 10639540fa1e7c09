"""The one error type users see, and the one-line form of every error message they read."""

MAX_LINE = 500  # characters of an error line; a third party's message (Ray, Cloud Storage, TensorFlow) is cut


class UsageError(Exception):
    """Bad input (config, flags, run folder, weights): printed as one line, exit status 2."""


def one_line(message: object) -> str:
    """`message` (an exception, say) on one line of at most MAX_LINE characters."""
    line = " ".join(str(message).split())
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."
