"""How a data set's columns become a model's inputs: the one place training, validation, `infer`
and the memory check ask.

A model's Keras inputs take the data's columns of the same names, as Keras feeds a dict of
features; a model of one input that no column names takes the `circuit` column (the QCNN's and
every single-input model's way). The label is the `label` column. By kind:

- binary (serialized circuits) feeds a `tf.string` input;
- a number feeds a float32 input of one value per example (shape `()` or `(1,)`);
- a list of numbers of one length feeds a float32 input of that shape.

The driver describes the columns from the Parquet schema (no TensorFlow); whoever holds the model
(the training workers, `infer`'s driver and actors) pairs them with its inputs (`feed`), and a model
input with no column of its name, or a column whose kind or width does not fit, is a UsageError
naming the model's inputs and the data's columns.
"""

import dataclasses

import numpy as np
import pyarrow as pa

from qml_ray.errors import UsageError

CIRCUIT, LABEL = "circuit", "label"
CIRCUITS, NUMBER, NUMBERS, OTHER = "circuits", "number", "numbers", "other"  # the kinds of a column


@dataclasses.dataclass(frozen=True)
class Column:
    """A data set's column: its name, its kind, and for a list of numbers its length (None: the
    lists differ in length, or the length is not known yet)."""

    name: str
    kind: str
    width: int | None = None

    def shown(self) -> str:
        width = f" of {self.width}" if self.kind == NUMBERS and self.width else ""
        return f"{self.name} ({self.kind}{width})"


@dataclasses.dataclass(frozen=True)
class ModelInput:
    """One of a model's Keras inputs: its name, whether it takes strings (serialized circuits), and
    its shape per example."""

    name: str
    takes_circuits: bool
    shape: tuple

    def shown(self) -> str:
        return f"{self.name} ({'circuits' if self.takes_circuits else f'float32 {self.shape}'})"


def kind_of(field: pa.Field) -> Column:
    """A Parquet field as a Column (a variable-length list's width is read later: datasets.list_widths)."""
    kind = field.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_string(kind):
        return Column(field.name, CIRCUITS)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return Column(field.name, NUMBER)
    fixed = pa.types.is_fixed_size_list(kind)
    if (fixed or pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
        pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)
    ):
        return Column(field.name, NUMBERS, kind.list_size if fixed else None)
    return Column(field.name, OTHER)


def columns_of(schema: pa.Schema) -> tuple[Column, ...]:
    return tuple(kind_of(field) for field in schema)


def list_width(table: pa.Table, name: str) -> int | None:
    """The one length of the lists in column `name` of `table`, or None when they differ."""
    import pyarrow.compute as pc

    lengths = pc.min_max(pc.list_value_length(table.column(name)))
    low, high = lengths["min"].as_py(), lengths["max"].as_py()
    return low if low == high else None


def usable(columns: tuple[Column, ...]) -> list[str]:
    """The columns that can feed a model's input, or be its label."""
    return [column.name for column in columns if column.kind != OTHER]


def key_columns(columns: tuple[Column, ...]) -> list[str]:
    """The columns whose values a row's held-out hash is keyed by: its circuit, or, in data without
    one, every column that can feed an input (the label aside)."""
    names = [column.name for column in columns]
    return [CIRCUIT] if CIRCUIT in names else sorted(set(usable(columns)) - {LABEL})


def row_keys(batch: dict) -> list[bytes]:
    """Each row's bytes to hash for the held-out split (`batch` holds `key_columns`' numpy columns)."""
    if CIRCUIT in batch:
        return [bytes(circuit) for circuit in batch[CIRCUIT]]
    names = sorted(set(batch) - {LABEL})
    return [b"".join(_value_bytes(batch[name][row]) for name in names) for row in range(len(batch[names[0]]))]


def _value_bytes(value) -> bytes:
    if isinstance(value, bytes | str):
        return value.encode() if isinstance(value, str) else value
    return np.asarray(value, np.float64).tobytes()


def model_inputs(model) -> tuple[ModelInput, ...]:
    """The model's Keras inputs; a model that declares none (subclassed) takes serialized circuits."""
    import tensorflow as tf

    if not getattr(model, "inputs", None):
        return (ModelInput(CIRCUIT, True, ()),)
    return tuple(
        ModelInput(name, tensor.dtype == tf.string, tuple(tensor.shape[1:]))
        for name, tensor in zip(model.input_names, model.inputs)
    )


@dataclasses.dataclass(frozen=True)
class Feed:
    """Which column feeds each of a model's inputs (in the model's order)."""

    pairs: tuple[tuple[ModelInput, Column], ...]

    @property
    def columns(self) -> list[str]:
        return [column.name for _, column in self.pairs]

    @property
    def circuit_columns(self) -> list[str]:
        return [column.name for model_input, column in self.pairs if model_input.takes_circuits]

    def inputs(self, batch: dict):
        """A batch's model inputs from its numpy columns: the array of the one input, or a dict by
        input name (as Keras feeds several)."""
        return as_keras_takes(self.by_input(batch))

    def by_input(self, batch: dict) -> dict[str, np.ndarray]:
        """A batch's numpy columns as its model inputs take them, by input name."""
        return {put.name: _values(batch[column.name], put, column) for put, column in self.pairs}

    def spec(self):
        """The tf.TensorSpec of `inputs`' batches (a dict of them for several inputs)."""
        import tensorflow as tf

        return as_keras_takes(
            {
                put.name: tf.TensorSpec([None, *put.shape], tf.string if put.takes_circuits else tf.float32)
                for put, _ in self.pairs
            }
        )


def as_keras_takes(by_input: dict):
    """What Keras takes for a model's inputs: the one input's value, or a dict by input name."""
    return next(iter(by_input.values())) if len(by_input) == 1 else by_input


def _values(array: np.ndarray, model_input: ModelInput, column: Column) -> np.ndarray:
    """A batch's column as its input takes it: circuits as objects, numbers as float32 of the input's shape."""
    if model_input.takes_circuits:
        return array.astype(object)
    if array.dtype == object:  # a list per row
        lengths = sorted({len(row) for row in array})
        if len(lengths) > 1:
            raise UsageError(f"the lists of column {column.name!r} differ in length ({', '.join(map(str, lengths))})")
        array = np.stack(array) if len(array) else array
    shape = tuple(-1 if size is None else size for size in model_input.shape)
    try:
        return np.asarray(array, np.float32).reshape(len(array), *shape)
    except ValueError:
        raise UsageError(
            f"column {column.shown()} does not fit model input {model_input.shown()}: "
            f"its values per row have shape {np.shape(array)[1:]}"
        ) from None


def feed(inputs: tuple[ModelInput, ...], columns: tuple[Column, ...], where: str) -> Feed:
    """Pair each model input with the column of its name (a single input no column names: `circuit`),
    or a UsageError naming the model's inputs and the data's (at `where`) columns."""
    found = {column.name: column for column in columns}
    named = [found.get(model_input.name) for model_input in inputs]
    if len(inputs) == 1 and named[0] is None and CIRCUIT in found:
        named = [found[CIRCUIT]]
    for model_input, column in zip(inputs, named):
        problem = _misfit(model_input, column)
        if problem:
            raise UsageError(
                f"{problem} (the model's inputs: {', '.join(i.shown() for i in inputs)}; the columns of {where}: "
                f"{', '.join(c.shown() for c in columns)})"
            )
    return Feed(tuple(zip(inputs, named)))


def _misfit(model_input: ModelInput, column: Column | None) -> str | None:
    """Why `column` cannot feed `model_input`, or None."""
    if column is None:
        more = " and no 'circuit' column" if model_input.takes_circuits else ""
        return f"model input {model_input.name!r} has no column of its name{more}"
    fitting = (CIRCUITS,) if model_input.takes_circuits else (NUMBER, NUMBERS)
    if column.kind not in fitting:
        takes = "serialized circuits" if model_input.takes_circuits else "numbers"
        return f"column {column.shown()} cannot feed model input {model_input.name!r}, which takes {takes}"
    if column.kind == NUMBERS and column.width is None:
        return f"the lists of column {column.name!r} differ in length: model input {model_input.name!r} takes one shape"
    if model_input.takes_circuits or None in model_input.shape:
        return None
    values = int(np.prod(model_input.shape, dtype=int))
    if values != (column.width if column.kind == NUMBERS else 1):
        return f"column {column.shown()} does not fit model input {model_input.shown()}: {values} value(s) per row"
    return None
