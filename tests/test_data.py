"""The excitation data set: seeded, shared by every worker, sharded without overlap."""

import hashlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from qml_ray import config as config_lib, data, datasets, storage
from qml_ray.config import Config

from conftest import TUTORIAL

CONFIG = Config(qubits=5, examples=101, seed=11)


def test_same_seed_writes_identical_parquet(tmp_path):
    data.write(CONFIG, str(tmp_path / "a"))
    data.write(CONFIG, str(tmp_path / "b"))
    for split in datasets.SPLITS:
        first = pq.read_table(storage.split_path(str(tmp_path / "a"), split))
        second = pq.read_table(storage.split_path(str(tmp_path / "b"), split))
        assert first.equals(second)
        assert first.num_rows > 0


def test_another_seed_gives_other_data():
    assert not data.generate(CONFIG)["train"].equals(data.generate(CONFIG.replace(seed=12))["train"])


def test_labels_follow_the_excitation_angle_and_splits_cover_all_examples():
    tables = data.generate(CONFIG)
    assert sum(t.num_rows for t in tables.values()) == CONFIG.examples
    assert tables["validation"].num_rows == round(CONFIG.examples * CONFIG.test_fraction)
    for table in tables.values():
        angles, labels = table.column("angle").to_numpy(), table.column("label").to_numpy()
        np.testing.assert_array_equal(labels, np.where(np.abs(angles) <= np.pi / 2, 1.0, -1.0))
        assert set(table.column("qubit").to_pylist()) <= set(range(CONFIG.qubits))


@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_shards_are_equal_and_disjoint(world_size):
    """As Ray Train shards a Ray Dataset: equal shards, the last rows % world_size rows left out."""
    train = data.generate(CONFIG)["train"]
    shards = [datasets.shard(train, rank, world_size).column("id").to_pylist() for rank in range(world_size)]
    flat = [i for shard in shards for i in shard]
    assert len(flat) == len(set(flat)) == train.num_rows - train.num_rows % world_size
    assert set(flat) <= set(train.column("id").to_pylist())
    assert len({len(shard) for shard in shards}) == 1


def test_the_tutorial_data_set_is_the_one_drawn_before_ray_data_fed_training():
    """The same seed draws the same examples as qml_ray did when every worker read the whole set."""
    digest = hashlib.sha256()
    for table in data.generate(config_lib.load(TUTORIAL)).values():
        for column in ("id", "circuit", "label", "angle", "qubit"):
            digest.update(repr(table.column(column).to_pylist()).encode())
    assert digest.hexdigest() == "848056bac2131da913e6ee11394dfa3cc7b4c866e7a7216cd433509c15f3bd87"
