"""The one error type users see: a mistake they can fix, reported in one line."""


class UsageError(Exception):
    """Bad input (config, flags, run folder, weights): printed as one line, exit status 2."""
