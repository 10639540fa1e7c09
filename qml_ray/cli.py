"""Command-line plumbing shared by the commands: config flags, a quiet console and one-line errors."""

import argparse
import contextlib
import importlib
import os
import sys

from qml_ray import config as config_lib, interrupts
from qml_ray.errors import ENVIRONMENT_STATUS, USAGE_STATUS, EnvironmentProblem, UsageError, one_line

# The value a config key's flag takes, where its type does not say it well (the rest: N, or true|false).
_METAVARS = {
    "model": "MODULE:FUNCTION",
    "callbacks": "MODULE:FUNCTION",
    "data": "PATH",
    "validation_data": "PATH",
    "test_fraction": "FRACTION",
    "learning_rate": "RATE",
    "storage": "PATH",
    "profile_steps": "START,STOP",
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a bad flag reported in one line and exit status 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """--config, and a flag for every config key (--cpus-per-worker for cpus_per_worker, ...)."""
    parser.add_argument(
        "--config", metavar="YAML", help="config file; the keys it leaves out take the built-in defaults"
    )
    keys = parser.add_argument_group(
        "config keys", "each flag sets the key of its name (--cpus-per-worker: cpus_per_worker) over the config file"
    )
    for key, field in config_lib.FIELDS.items():
        if key == "params":
            continue
        keys.add_argument(
            flag(key),
            dest=key,
            metavar=_metavar(key),
            help=f"{config_lib.doc(key)} [default: {_shown(field.default)}]".replace("%", "%%"),
        )
    keys.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the model function, its value read as YAML reads it (0.1, 2, true, relu); "
        "repeat for more; over the config file's params",
    )


def flag(key: str) -> str:
    """The command-line flag of a config key."""
    return "--" + key.replace("_", "-")


def _metavar(key: str) -> str:
    if key in config_lib.CHOICES:
        return "|".join(config_lib.CHOICES[key])
    return _METAVARS.get(key, "true|false" if config_lib.kind(key) is bool else "N")


def _shown(default) -> str:
    """A default as its flag would spell it."""
    if isinstance(default, bool):
        return str(default).lower()
    return str(default) if default != "" else "empty"


def add_address_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        help="Ray to run on: by default the cluster of a `ray job submit` job, else a new local Ray; "
        "'auto' joins RAY_ADDRESS or the cluster started on this machine; or HOST:PORT / ray://HOST:PORT",
    )


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show Ray's and TensorFlow's logs from every process (always kept in Ray's log files, "
        "/tmp/ray/session_latest/logs on each node)",
    )


@contextlib.contextmanager
def native_stderr_hidden(hidden: bool = True):
    """While the block runs, send what native code writes straight to this process's stderr
    (TensorFlow's start-up lines, Ray's core-worker notices) to /dev/null, unless not `hidden`
    (--verbose). Ray's processes keep their logs in Ray's log files either way."""
    if not hidden:
        yield
        return
    sys.stderr.flush()
    console = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(console, 2)
        os.close(console)


def overrides(args: argparse.Namespace) -> dict:
    """The config values given as flags (but --param: see `params_given`)."""
    return {key: getattr(args, key) for key in config_lib.FIELDS if key != "params" and getattr(args, key) is not None}


def params_given(args: argparse.Namespace) -> dict:
    """The model parameters given as --param KEY=VALUE flags, each value read as YAML reads it."""
    params = {}
    for spec in args.param:
        key, equals, value = spec.partition("=")
        if not equals or not key.strip():
            raise UsageError(f"--param takes KEY=VALUE, got {spec!r}")
        params[key.strip()] = config_lib.yaml_scalar(value, f"--param {spec}")
    return params


def config_from_args(args: argparse.Namespace) -> config_lib.Config:
    """The config file (or defaults) with the flags applied on top; the keys the file or the flags give
    count as given (`config.given`)."""
    base = config_lib.load(args.config) if args.config else config_lib.Config()
    values, params = config_lib.overlaid(config_lib.given(base), overrides(args)), params_given(args)
    if params:
        values["params"] = {**base.params, **params}
    return config_lib.from_mapping(values)


def fail(error: Exception, status: int) -> None:
    """End the command with `error` in one line and `status`; as an interrupted one ends, when a
    call into Ray it waited for still runs (Ray would end the process with status 1 on its way out)."""
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    if interrupts.abandoned():
        interrupts.exit_interrupted(status)
    sys.exit(status)


def run(main, argv=None) -> None:
    """Run a command's main: a UsageError ends it with one line on stderr and exit status 2, an
    EnvironmentProblem with one line and 1, SIGINT or SIGTERM with one line and 130 or 143. The kernel's
    path is chosen first, so a forced one this CPU cannot run ends the command before it starts anything."""
    interrupts.install()
    try:
        importlib.import_module("qml_ray.kernel")
        main(argv)
    except UsageError as err:
        fail(err, USAGE_STATUS)
    except EnvironmentProblem as err:
        fail(err, ENVIRONMENT_STATUS)
    except interrupts.Interrupted as interrupted:
        print(interrupts.last_line(), file=sys.stderr, flush=True)
        interrupts.exit_interrupted(interrupted.status)
