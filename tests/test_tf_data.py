"""No tf.data pipeline a worker's `fit` iterates autotunes, the strategy's per-device ones included:
the end of an autotuned iterator waits for its tuning thread (qml_ray/tf_data.py). The seconds from a
run's last epoch to its command's exit: `bench runtimes`' end_seconds."""

import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops

from qml_ray import tf_data


def device_pipeline(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The pipeline a one-device strategy's iterator over `dataset` reads from on its device."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    iterator = iter(strategy.distribute_datasets_from_function(lambda _: dataset))
    return iterator._iterators[0]._iterator._device_iterators[0]._dataset


def test_the_workers_pipelines_and_the_strategys_on_each_device_do_not_autotune(monkeypatch):
    maker = "_create_device_dataset"  # TensorFlow's, which untune_device_pipelines replaces: put back after
    monkeypatch.setattr(multi_device_iterator_ops, maker, getattr(multi_device_iterator_ops, maker))
    dataset = tf_data.untuned(tf.data.Dataset.range(8).batch(2).repeat())
    assert dataset.options().autotune.enabled is False
    assert tf.data.Dataset.range(8).options().autotune.enabled is not False  # TensorFlow's default: on
    tf_data.untune_device_pipelines()
    assert device_pipeline(dataset).options().autotune.enabled is False
