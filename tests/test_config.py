"""Config files and values: defaults, the shipped configs and every kind of bad value."""

import re

import pytest
import yaml

from qml_ray import config as config_lib
from qml_ray.config import Config, max_layers
from qml_ray.errors import UsageError

from conftest import ROOT


@pytest.mark.parametrize("name", ["smoke", "tutorial", "qcnn-23q", "bench-16q", "bench-20q"])
def test_shipped_configs_load_as_written(name):
    path = ROOT / "configs" / f"{name}.yaml"
    written = yaml.safe_load(path.read_text())
    config = config_lib.load(path)
    assert {key: getattr(config, key) for key in written} == written


def test_tutorial_config_is_the_original_model_and_training():
    config = config_lib.load(ROOT / "configs" / "tutorial.yaml")
    original = {
        "qubits": 8,
        "layers": 1,
        "examples": 160,
        "test_fraction": 0.3,
        "epochs": 50,
        "batch_size": 32,
        "learning_rate": 0.02,
        "hidden_activation": "linear",
        "workers": 2,
    }
    assert {key: getattr(config, key) for key in original} == original


def test_headline_config_is_the_23_qubit_run():
    config = config_lib.load(ROOT / "configs" / "qcnn-23q.yaml")
    assert (config.qubits, config.examples) == (23, 1000)


def test_a_worker_range_trains_elastically_and_the_global_batch_stays():
    config = config_lib.from_mapping({"workers": "2-3", "batch_size": 16})
    assert (config.min_workers, config.workers, config.elastic, config.worker_range) == (2, 3, True, "2-3")
    assert config_lib.from_mapping(yaml.safe_load(config.to_yaml())) == config
    assert [config_lib.worker_batch(config, n) for n in (3, 2, 1)] == [16, 24, 48]  # 48 circuits a step
    assert config_lib.worker_batch(config_lib.from_mapping({"workers": "1-3", "batch_size": 15}), 2) == 23  # 45/2 up
    for fixed in ({"workers": 3}, {"workers": "3-3"}):
        assert not config_lib.from_mapping(fixed).elastic and config_lib.from_mapping(fixed).worker_range == "3"


def test_max_layers():
    assert [max_layers(n) for n in (4, 5, 8, 16, 23)] == [2, 3, 3, 4, 5]


def test_profile_steps():
    assert Config().profile_range() is None
    assert config_lib.from_mapping({"profile_steps": 5}).profile_range() == (5, 5)  # YAML's `profile_steps: 5`
    assert config_lib.from_mapping({"profile_steps": "5,8"}).profile_range() == (5, 8)


def test_yaml_round_trip():
    config = Config(qubits=9, learning_rate=0.1)
    assert config_lib.from_mapping(yaml.safe_load(config.to_yaml())) == config


@pytest.mark.parametrize(
    "values, message",
    [
        ({"qubit": 4}, "unknown config key(s): qubit"),
        ({"qubits": 3}, "qubits must be at least 4"),
        ({"workers": 0}, "workers must be at least 1"),
        ({"workers": "8-"}, "workers must be a whole number or MIN-MAX (8-32), got '8-'"),
        ({"workers": "x-4"}, "workers must be a whole number or MIN-MAX"),
        ({"workers": "8-4"}, "min_workers must be at most workers (4)"),
        ({"workers": 4, "min_workers": 5}, "min_workers must be at most workers (4)"),
        ({"epochs": 0}, "epochs must be at least 1"),
        ({"qubits": "many"}, "qubits must be a whole number, got 'many'"),
        ({"qubits": 4.5}, "qubits must be a whole number"),
        ({"epochs": True}, "epochs must be a whole number"),
        ({"learning_rate": "fast"}, "learning_rate must be a number"),
        ({"layers": 4, "qubits": 8}, "layers must be 1..3 for 8 qubits"),
        ({"test_fraction": 1.0}, "test_fraction must be between 0 and 1"),
        ({"size_thread_pools": "maybe"}, "size_thread_pools must be true or false, got 'maybe'"),
        ({"profile_steps": "8,5"}, "profile_steps must be START,STOP (1 <= START <= STOP) or one step, got '8,5'"),
        ({"profile_steps": "0"}, "profile_steps must be START,STOP"),
        ({"profile_steps": "5-8"}, "profile_steps must be START,STOP"),
        ({"profiler_port": 80}, "profiler_port must be 0 (off) or 1024..65534"),
    ],
)
def test_bad_values_are_rejected(values, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        config_lib.from_mapping(values)


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(UsageError, match="config file not found"):
        config_lib.load(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("qubits: [4\n")
    with pytest.raises(UsageError, match="cannot read config file"):
        config_lib.load(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(UsageError, match="must hold a mapping"):
        config_lib.load(listed)
