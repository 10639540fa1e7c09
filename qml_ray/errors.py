"""The errors users see, and the one-line form of every error message they read.

A UsageError is the user's mistake (config, flags, names, run folder): exit status 2, nothing
written. An EnvironmentProblem is the environment's (storage full or refused, network,
credentials, a damaged checkpoint): exit status 1, one line naming what and where.
"""

MAX_LINE = 500  # characters of an error line; a third party's message (Ray, Cloud Storage, TensorFlow) is cut
USAGE_STATUS, ENVIRONMENT_STATUS = 2, 1


class UsageError(Exception):
    """Bad input (config, flags, run folder, weights): printed as one line, exit status 2."""


class ModelError(UsageError):
    """The model function or what it returned breaks the contract (qml_ray.contract)."""


class EnvironmentProblem(Exception):
    """The environment failed the command (storage, network, credentials): one line, exit status 1."""


def one_line(message: object) -> str:
    """`message` (an exception, say) on one line of at most MAX_LINE characters."""
    line = " ".join(str(message).split())
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."
