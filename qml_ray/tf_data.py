"""tf.data without its autotuning, for every pipeline a worker's `fit` iterates.

Each tf.data iterator that autotunes has a tuning thread of its own, and the iterator's end waits
for that thread to stop (py-spy: `RootDataset::Iterator::~Iterator` in the thread's join). At the end
of a `fit` the worker waited there 0-79 s between its last epoch and its return (the tutorial config:
5-19 s). Nothing is there to tune: the pipelines hand over circuits as strings to a simulation that
takes far longer than any batch.

Two kinds of pipeline: the worker's own (`untuned`), and those a tf.distribute strategy builds on
each device from them, which do not inherit their options (`untune_device_pipelines`; TensorFlow
2.18's multi_device_iterator_ops, the only place they are made).
"""

import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops


def untuned(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset`, and every pipeline built on it, without autotuning."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def untune_device_pipelines() -> None:
    """Make the strategies' per-device pipelines untuned, from now on in this process."""
    multi_device_iterator_ops._create_device_dataset = _untuned_device_dataset


_device_dataset = multi_device_iterator_ops._create_device_dataset  # TensorFlow's own


def _untuned_device_dataset(*args, **kwargs) -> tf.data.Dataset:
    return untuned(_device_dataset(*args, **kwargs))
