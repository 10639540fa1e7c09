"""The data contract, and how the data reaches the workers: Ray Datasets, streamed in shards.

A data set is Parquet (a file, or a folder of files; local or gs://) with the columns its model's
inputs take (features.py: a binary `circuit` column of serialized circuits, what
`tfq.convert_to_tensor` gives, for a model of one circuit input; else the columns named as the
model's inputs) and a `label` column: a float, or a fixed-length list of floats for a model of
several outputs. Other columns (an `id`, say) are carried along to the predictions. Without
`validation_data`, a `test_fraction` of the rows, chosen by a hash of each row's circuit (or, with
no circuit column, of its other values) and the seed, is held out: the same rows on every worker and
in every rerun, however the files are read.

The driver (no TensorFlow) describes the data, records it in the run folder (data.json, which a
resumed run must still match) and hands Ray Train one Dataset per split; Ray Train splits each
into one equal shard per worker, which the worker turns into a tf.data.Dataset.
"""

import dataclasses
import hashlib
import json

import numpy as np
import pyarrow as pa

from qml_ray import features, filesystem, storage
from qml_ray.errors import UsageError

MANIFEST = "data.json"  # in a run folder: the files, rows and split the run trains on
SPLITS = ("train", "validation")


@dataclasses.dataclass(frozen=True)
class Source:
    """Parquet files and what the run needs to know of them."""

    files: tuple[tuple[str, int, int], ...]  # (path, bytes, rows) of every file
    label_width: int  # 1 for a float label, else the list's length
    columns: tuple[features.Column, ...] = ()  # every column, its kind and a list's length

    @property
    def rows(self) -> int:
        return sum(rows for _, _, rows in self.files)

    @property
    def paths(self) -> list[str]:
        return [path for path, _, _ in self.files]

    @property
    def bytes(self) -> int:
        return sum(size for _, size, _ in self.files)

    @property
    def usable(self) -> list[str]:
        """The columns read for training: those that can feed a model's input, and the label."""
        return features.usable(self.columns)


def describe(location: str, needs_label: bool = True) -> Source:
    """The Parquet files at `location` (a file or a folder), or a UsageError saying what is wrong."""
    import pyarrow.dataset as ds

    filesystem, path = storage.pyarrow_filesystem(location)
    if not storage.exists(location):
        raise UsageError(f"no data at {location}")
    try:
        dataset = ds.dataset(path, format="parquet", filesystem=filesystem, exclude_invalid_files=False)
        files = tuple(
            (_full(location, fragment.path), _size(dataset.filesystem, fragment.path), fragment.count_rows())
            for fragment in dataset.get_fragments()
        )
    except (OSError, pa.ArrowException) as err:
        raise UsageError(f"cannot read {location} as Parquet: {err}") from None
    schema = dataset.schema
    if "circuit" in schema.names and features.kind_of(schema.field("circuit")).kind != features.CIRCUITS:
        kind = schema.field("circuit").type
        raise UsageError(f"the 'circuit' column of {location} must hold serialized circuits (binary), not {kind}")
    if not any(rows for _, _, rows in files):
        raise UsageError(f"{location} has no rows")
    width = label_width(schema, location) if needs_label or "label" in schema.names else 0
    return Source(files, width, list_widths(features.columns_of(schema), files))


def list_widths(columns: tuple[features.Column, ...], files) -> tuple[features.Column, ...]:
    """`columns` with each list column's one length, read from its values where the schema does not
    fix it (None: the lists differ in length)."""
    unknown = [column.name for column in columns if column.kind == features.NUMBERS and column.width is None]
    if not unknown:
        return columns
    table = read_paths([path for path, _, rows in files if rows], unknown)
    widths = {name: features.list_width(table, name) for name in unknown}
    return tuple(dataclasses.replace(c, width=widths[c.name]) if c.name in widths else c for c in columns)


def label_width(schema: pa.Schema, location: str) -> int:
    """How many floats a row's label holds, or a UsageError when the `label` column is not labels."""
    if "label" not in schema.names:
        raise UsageError(f"{location} has no 'label' column (its columns: {', '.join(schema.names)})")
    kind = schema.field("label").type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return 1
    if pa.types.is_fixed_size_list(kind) and (
        pa.types.is_floating(kind.value_type) or pa.types.is_integer(kind.value_type)
    ):
        return kind.list_size
    raise UsageError(
        f"the 'label' column of {location} must hold a number or a fixed-length list of numbers, not {kind}"
    )


def _full(location: str, fragment_path: str) -> str:
    """A fragment's path in the location's own spelling (gs://... for Cloud Storage)."""
    return filesystem.GCS_PREFIX + fragment_path if filesystem.is_gcs(location) else fragment_path


def _size(filesystem, path: str) -> int:
    return filesystem.get_file_info(path).size


def held_out(circuits, seed: int, fraction: float) -> np.ndarray:
    """Per circuit, whether it is held out for validation: a keyed hash of its bytes below `fraction`."""
    key = seed.to_bytes(8, "little")
    scores = [
        int.from_bytes(hashlib.blake2b(bytes(circuit), digest_size=8, key=key).digest(), "little") / 2**64
        for circuit in circuits
    ]
    return np.array(scores) < fraction


def _split_batch(batch: dict, seed: int, fraction: float, validation: bool) -> dict:
    keep = held_out(features.row_keys(batch), seed, fraction) == validation
    return {column: values[keep] for column, values in batch.items()}


# Ray Data's tasks (reading files, splitting rows) reserve no CPU: the workers hold every CPU of
# their nodes for simulation, and a task that waited for one would wait forever. Reading and
# hashing take little next to simulating the circuits they feed; a few at a time keep up.
DATA_TASKS_AT_ONCE = 4


def _data_tasks() -> dict:
    import ray.data

    return {"num_cpus": 0, "compute": ray.data.TaskPoolStrategy(size=DATA_TASKS_AT_ONCE)}


def read(source: Source, columns: list[str] | None = None):
    """A Ray Dataset of the source's files, streamed a file per task (each file a block)."""
    import ray.data

    files = ray.data.from_items([{"path": path} for path in source.paths], override_num_blocks=len(source.paths))
    return files.map_batches(
        _read_files, fn_kwargs={"columns": columns}, batch_size=1, batch_format="pyarrow", **_data_tasks()
    )


def _read_files(batch: pa.Table, columns: list[str] | None) -> pa.Table:
    return read_paths(batch.column("path").to_pylist(), columns)


def read_paths(locations: list[str], columns: list[str] | None = None) -> pa.Table:
    """The Parquet files at `locations`, read whole into this process, as one table."""
    import pyarrow.parquet as pq

    tables = []
    for location in locations:
        filesystem, path = storage.pyarrow_filesystem(location)
        try:
            tables.append(pq.read_table(path, filesystem=filesystem, columns=columns))
        except (OSError, pa.ArrowException) as err:
            raise UsageError(f"cannot read {location} as Parquet: {err}") from None
    return pa.concat_tables(tables)


def split(dataset, seed: int, fraction: float, validation: bool):
    """The rows of `dataset` held out for validation (or, not `validation`, the others)."""
    return dataset.map_batches(
        _split_batch,
        fn_kwargs={"seed": seed, "fraction": fraction, "validation": validation},
        batch_format="numpy",
        **_data_tasks(),
    )


def sources(config, run: str) -> tuple[Source, Source | None]:
    """The training data and the validation data (None: held out of the training data by hash)."""
    if not config.data:
        return describe(storage.split_path(run, "train")), describe(storage.split_path(run, "validation"))
    train = describe(config.data)
    validation = describe(config.validation_data) if config.validation_data else None
    if validation and validation.label_width != train.label_width:
        raise UsageError(
            f"the labels of {config.validation_data} hold {validation.label_width} value(s), "
            f"those of {config.data} {train.label_width}"
        )
    missing = [c for c in train.columns if validation and c.name in train.usable and c not in validation.columns]
    if missing:
        raise UsageError(f"{config.validation_data} has no column {missing[0].shown()}, as {config.data} has")
    return train, validation


def splits(config, train: Source, validation: Source | None, columns: list[str] | None = None) -> dict:
    """The Ray Datasets (lazy) of the training and validation splits: the validation files, or the
    rows held out of the training data."""
    if validation is not None:
        return {"train": read(train, columns), "validation": read(validation, columns)}
    whole = read(train, columns)
    return {name: split(whole, config.seed, config.test_fraction, name == "validation") for name in SPLITS}


def for_training(config, train: Source, validation: Source | None) -> tuple[dict, dict]:
    """The Ray Datasets of the two splits (the columns that can feed a model, and the label), and
    their row counts."""
    datasets = splits(config, train, validation, train.usable)
    if validation is not None:
        return datasets, {"train": train.rows, "validation": validation.rows}
    return datasets, held_out_rows(config, train)


def held_out_rows(config, train: Source) -> dict:
    """Each split's rows when the validation rows are held out of the training files: one pass
    over their circuits, counting both (a Dataset.count per split would read them twice)."""
    counts = read(train, features.key_columns(train.columns)).map_batches(
        _count_splits,
        fn_kwargs={"seed": config.seed, "fraction": config.test_fraction},
        batch_format="numpy",
        **_data_tasks(),
    )
    totals = counts.sum(list(SPLITS))
    return {split: int(totals[f"sum({split})"]) for split in SPLITS}


def _count_splits(batch: dict, seed: int, fraction: float) -> dict:
    keys = features.row_keys(batch)
    held = int(held_out(keys, seed, fraction).sum())
    return {"train": [len(keys) - held], "validation": [held]}


def fits_in_memory(config, train: Source, validation: Source | None) -> bool:
    """Whether each worker keeps its shards in memory (the whole data set's Parquet is at most
    `data_in_memory_mb`), or streams them from storage every epoch."""
    files = train.bytes + (validation.bytes if validation else 0)
    return files <= config.data_in_memory_mb * 2**20


# A bound on the Parquet bytes of one example of the QCNN's generated data set (about 60 here).
GENERATED_BYTES_PER_EXAMPLE = 200


def generated_fits_in_memory(config) -> bool:
    """Whether the QCNN's generated data set, not drawn yet, will be kept in memory (fits_in_memory)."""
    return config.examples * GENERATED_BYTES_PER_EXAMPLE <= config.data_in_memory_mb * 2**20


def kept_splits(config, train: Source, validation: Source | None) -> dict[str, pa.Table]:
    """The two splits (the columns that can feed a model, and the label) read whole into this
    process: the validation files, or the rows held out of the training data, as `split` holds them out."""
    whole = read_paths(train.paths, train.usable)
    if validation is not None:
        return {"train": whole, "validation": read_paths(validation.paths, train.usable)}
    keys = features.row_keys(numpy_columns(whole, features.key_columns(train.columns)))
    held = held_out(keys, config.seed, config.test_fraction)
    return {"train": whole.filter(pa.array(~held)), "validation": whole.filter(pa.array(held))}


def numpy_columns(table: pa.Table, names: list[str]) -> dict[str, np.ndarray]:
    """Columns of `table` as numpy arrays (binary and list columns as arrays of objects)."""
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in names}


def shard(table: pa.Table, rank: int, world_size: int) -> pa.Table:
    """Rows rank, rank + world_size, ... of the first num_rows - num_rows % world_size: equal shards
    that together hold all but those last rows, as Ray Train shards a Ray Dataset."""
    return table.take(np.arange(rank, table.num_rows - table.num_rows % world_size, world_size))


def write_generated(config, run: str, tables: dict[str, pa.Table]) -> None:
    """Write a generated data set's splits (data.generate's tables) to the run folder, then data.json."""
    for split, table in tables.items():
        storage.write_parquet(table, storage.split_path(run, split))
    train, validation = sources(config, run)
    write_manifest(run, manifest(config, train, validation, {"train": train.rows, "validation": validation.rows}))


def manifest(config, train: Source, validation: Source | None, rows: dict) -> dict:
    """What the run trains on: every file (path, bytes, rows), the split, and each split's rows."""
    return {
        **_files(train, validation),
        "held_out": None if validation else {"seed": config.seed, "test_fraction": config.test_fraction},
        "label_width": train.label_width,
        "rows": rows,
    }


def _files(train: Source, validation: Source | None) -> dict:
    """Each split's files as JSON holds them (None: validation held out of the training files)."""
    return {"train": [list(f) for f in train.files], "validation": validation and [list(f) for f in validation.files]}


def write_manifest(run: str, recorded: dict) -> None:
    storage.write_text(storage.join(run, MANIFEST), json.dumps(recorded, indent=1))


def read_manifest(run: str) -> dict | None:
    path = storage.join(run, MANIFEST)
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


def require_unchanged(run: str, recorded: dict, train: Source, validation: Source | None) -> None:
    """A UsageError when the data a resumed run would train on differs from what it started on."""
    now = _files(train, validation)
    for name in SPLITS:
        if now[name] != recorded[name]:
            changed = sorted({tuple(f) for f in now[name] or []} ^ {tuple(f) for f in recorded[name] or []})
            what = f": {changed[0][0]}" if changed else ""
            raise UsageError(
                f"cannot resume {run}: its {name} data changed since it started{what} "
                "(files added, removed or rewritten); start a new run"
            )
