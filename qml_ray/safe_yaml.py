"""YAML read safely: a config file is small, and no alias may blow it up.

PyYAML's safe loader builds only plain values, but an alias repeats what its anchor holds without
copying it, so a few hundred bytes can stand for billions of values ("billion laughs"): harmless
until something walks them, as an error message printing the value does. Here a document is
refused when it is larger than MAX_BYTES, when its values, with every alias expanded, number more
than MAX_VALUES, or when it nests deeper than the parser can follow.
"""

import yaml

from qml_ray.errors import UsageError

MAX_BYTES = 1 << 20
MAX_VALUES = 10_000


def read(path, where: str):
    """The values of the YAML file at `path` (`where` names it in the messages); reading it may
    raise OSError or UnicodeError."""
    with open(path, "rb") as f:
        content = f.read(MAX_BYTES + 1)
    if len(content) > MAX_BYTES:
        raise UsageError(f"{where} is larger than {MAX_BYTES >> 20} MiB: not a config file")
    return load(content.decode(), where)


def load(text: str, where: str):
    """The values of the YAML document `text` (`where` names it in the messages)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and _expanded_size(node, {}) > MAX_VALUES:
            raise UsageError(f"{where} holds more than {MAX_VALUES} values once its aliases are expanded")
        return yaml.safe_load(text)
    except RecursionError:
        raise UsageError(f"{where} nests its values too deeply") from None
    except yaml.YAMLError as err:
        raise UsageError(f"cannot read {where}: {err}") from None


def _expanded_size(node: yaml.Node, sizes: dict) -> int:
    """How many values `node` stands for with its aliases expanded (`sizes`: those counted, by node)."""
    if id(node) not in sizes:
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        sizes[id(node)] = 1 + sum(_expanded_size(child, sizes) for child in children)
    return sizes[id(node)]
