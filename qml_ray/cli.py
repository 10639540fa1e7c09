"""Command-line plumbing shared by the commands: config flags and one-line errors."""

import argparse
import sys

from qml_ray import config as config_lib
from qml_ray.errors import UsageError, one_line

# Config keys that have a command-line flag (--cpus-per-worker for cpus_per_worker, ...).
CONFIG_FLAGS = ("workers", "cpus_per_worker", "qubits", "layers", "examples", "epochs", "batch_size",
                "seed", "differentiator", "checkpoint_every", "max_failures", "capacity_timeout", "storage",
                "profile_steps", "profiler_port")
_METAVARS = {"storage": "PATH", "profile_steps": "START,STOP", "differentiator": "auto|block|tfq"}  # the rest take N


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a bad flag reported in one line and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="YAML", help="config file (default: the built-in defaults)")
    for key in CONFIG_FLAGS:
        default = config_lib.FIELDS[key].default
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, metavar=_METAVARS.get(key, "N"),
                            help=f"override config '{key}' (built-in default: {default if default != '' else 'off'})")


def add_address_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        help="Ray to run on: by default the cluster of a `ray job submit` job, else a new local Ray; "
        "'auto' joins RAY_ADDRESS or the cluster started on this machine; or HOST:PORT / ray://HOST:PORT",
    )


def overrides(args: argparse.Namespace) -> dict:
    """The config values given as flags."""
    return {key: getattr(args, key) for key in CONFIG_FLAGS if getattr(args, key) is not None}


def config_from_args(args: argparse.Namespace) -> config_lib.Config:
    """The config file (or defaults) with the flags applied on top."""
    base = config_lib.load(args.config) if args.config else config_lib.Config()
    return config_lib.from_mapping({**config_lib.asdict(base), **overrides(args)})


def run(main, argv=None) -> None:
    """Run a command's main, turning a UsageError into one line on stderr and exit status 2."""
    try:
        main(argv)
    except UsageError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        sys.exit(2)
