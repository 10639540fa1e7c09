"""The Pythons the project supports (3.11 and 3.12), and what differs between them: pyproject.toml's
requires-python and the same range as the marker of every pin, so that pip on another Python stops at
requires-python's one line; tf-keras's layer seeds (qml_ray/keras_seeds.py)."""

import random
import tomllib

import pytest
import tensorflow as tf
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from tf_keras.src import backend

from qml_ray import keras_seeds  # noqa: F401

from conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SUPPORTED = SpecifierSet(PROJECT["requires-python"])
GROUPS = {"dependencies": PROJECT["dependencies"], **PROJECT["optional-dependencies"]}
PYTHONS = [f"3.{minor}" for minor in range(8, 16)]


@pytest.mark.parametrize("group", GROUPS)
def test_each_package_has_one_exact_pin_on_a_supported_python_and_none_on_another(group):
    pins = [Requirement(line) for line in GROUPS[group]]
    assert all(len(pin.specifier) == 1 and next(iter(pin.specifier)).operator == "==" for pin in pins)
    for python in PYTHONS:
        taken = sorted(pin.name for pin in pins if pin.marker and pin.marker.evaluate({"python_version": python}))
        assert taken == (sorted({pin.name for pin in pins}) if python in SUPPORTED else []), python


def test_the_supported_pythons_are_the_ones_the_readme_names():
    assert [python for python in PYTHONS if python in SUPPORTED] == ["3.11", "3.12"]
    assert "Python 3.11 or 3.12 on Linux" in (ROOT / "README.md").read_text()


@pytest.mark.core
def test_seeded_tf_keras_builds_layers_with_the_seeds_of_python_3_11():
    """After set_random_seed, tf-keras draws layer seeds with randint(1, 1e9): the same numbers as
    random.Random(seed) with whole bounds (Python 3.11's), and a layer builds (Python 3.12 refused it)."""
    tf.keras.utils.set_random_seed(7)
    drawn = [backend._SEED_GENERATOR.generator.randint(1, 1e9) for _ in range(3)]
    expected = random.Random(7)
    assert drawn == [expected.randint(1, 10**9) for _ in range(3)]
    layer = tf.keras.layers.Dense(2)
    layer.build((None, 3))
    assert layer.kernel.shape == (3, 2)
