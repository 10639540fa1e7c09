"""docs/configuration.md, written from the config model: every key's flag, default and meaning, as
`--help` gives them, so the page cannot drift from the code.

    python -m qml_ray.config_docs > docs/configuration.md
"""

import argparse

from qml_ray import cli, config as config_lib

INTRO = """\
# Configuration keys

What you get here: every key of a run's config, with its command-line flag, its built-in default and
what it means. This page is generated from the config model (`qml_ray/config.py`) by
`python -m qml_ray.config_docs > docs/configuration.md`, and a test checks it is current, so it says
what `python -m qml_ray.train --help` says.

One YAML file (`--config`) holds any of these keys; the keys it leaves out take the built-in defaults,
and a flag wins over the file. `train`, `sweep` and `cluster render` read the same keys (see
[the commands](commands.md)); a run records its resolved config in `config.yaml`
(see [storage](storage.md#the-run-folder)).

| key | flag | default | meaning |
| --- | --- | --- | --- |
"""


def markdown() -> str:
    """The page: the introduction, then one table row per config key, in the model's order."""
    parser = argparse.ArgumentParser()
    cli.add_config_flags(parser)
    flags = {action.dest: action for action in parser._actions}
    rows = [row(key, flags[key] if key != "params" else flags["param"]) for key in config_lib.FIELDS]
    return INTRO + "".join(rows)


def row(key: str, action: argparse.Action) -> str:
    """A key's table row: its flag as `--help` spells it, its default and its description."""
    default = config_lib.FIELDS[key].get_default(call_default_factory=True)
    cells = [
        f"`{key}`",
        f"`{action.option_strings[0]} {action.metavar}`",
        "empty" if default in ("", {}) else f"`{str(default).lower() if isinstance(default, bool) else default}`",
        config_lib.doc(key),
    ]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |\n"


if __name__ == "__main__":
    print(markdown(), end="")
