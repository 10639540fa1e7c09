"""Ray Train's TensorFlow set-up, TF_CONFIG on every worker, from a module that imports no TensorFlow.

Ray's own `TensorflowConfig` lives in the `ray.train.tensorflow` package, whose import starts
TensorFlow (4-5 s of CPU here): in the command, and again in Ray Train's controller, which
unpickles the config. `TFConfig` sets up the workers the same way, so only they import it.

Importing this module has Ray Train's elastic policy size worker groups on the live nodes, and start no
DatasetManager for a run given no datasets, in the controller's process too, which imports it to
unpickle the config (ray_internals).
"""

import json
import os
import socket

import ray
from ray.train.backend import Backend, BackendConfig

from qml_ray.ray_internals import (
    TrainingFramework,
    no_dataset_manager_without_datasets,
    size_elastic_groups_on_the_live_nodes,
)

size_elastic_groups_on_the_live_nodes()
no_dataset_manager_without_datasets()


class TFConfig(BackendConfig):
    """Pass as a DataParallelTrainer's backend_config, in place of Ray's TensorflowConfig."""

    @property
    def backend_cls(self):
        return TFConfigBackend

    @property
    def framework(self):
        return TrainingFramework.TENSORFLOW  # the dashboard's Train view shows its version


class TFConfigBackend(Backend):
    def on_start(self, worker_group, backend_config: TFConfig):
        """Give every worker the cluster's addresses and its own index, as TF_CONFIG, and have every
        worker finish importing TensorFlow now, all at once (worker_setup.py began it at the process's
        start): Ray Train next asks rank 0 alone for the framework's version (the dashboard's Train
        view shows it), which would import it there first, then on the others (3 s more of the
        tutorial config's start here)."""
        addresses = worker_group.execute(_address)
        ray.get(
            [
                worker_group.execute_single_async(rank, _set_tf_config, addresses=addresses, index=rank)
                for rank in range(len(worker_group))
            ]
        )
        worker_group.execute(_import_tensorflow)


def _address() -> str:
    """This node's IP and a free port on it, for the worker's collective ops server."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return f"{ray.util.get_node_ip_address()}:{sock.getsockname()[1]}"


def _set_tf_config(addresses: list[str], index: int) -> None:
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})


def _import_tensorflow() -> None:
    import tensorflow  # noqa: F401
