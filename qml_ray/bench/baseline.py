"""`python -m qml_ray.bench.baseline`: the runtime qml_ray replaces, run on this machine.

What tf-operator does on Kubernetes: N plain Python processes, each handed a TF_CONFIG that
names every worker and its own index, each running MultiWorkerMirroredStrategy. They train
the same model on the same data with the same per-worker batch as qml_ray (all runtimes run
worker.build_replica and worker.train_replica, with the config's callbacks). With
--no-distribution, one process trains under TensorFlow's default strategy instead. Like `train`,
the command first writes the run folder (config, data set).
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

from qml_ray import cli, config as config_lib, runtime, storage
from qml_ray.errors import UsageError


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.bench.baseline",
        description="Train like tf-operator does: --workers plain processes with hand-written TF_CONFIGs "
        "running MultiWorkerMirroredStrategy (or, with --no-distribution, one undistributed process).",
    )
    cli.add_config_flags(parser)
    parser.add_argument("--name", help="run name (required); the run folder is <storage>/<name>")
    parser.add_argument(
        "--no-distribution",
        action="store_true",
        help="train in one process without a distribution strategy (needs --workers 1)",
    )
    parser.add_argument(
        "--worker",
        metavar="RUN",
        help="(started by the command itself) be one worker of run folder RUN, as TF_CONFIG says",
    )
    return parser.parse_args(argv)


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that are free now."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def tf_configs(ports: list[int]) -> list[str]:
    """The TF_CONFIG of each worker of a cluster on this machine's loopback at `ports`."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}) for index in range(len(ports))]


def launch(config: config_lib.Config, run: str, distributed: bool) -> None:
    """Start the worker processes, wait for all, and stop the others as soon as one fails."""
    base = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    base.update(runtime.worker_env(config.cpus_per_worker, config.size_thread_pools))
    envs = [{**base, "TF_CONFIG": spec} for spec in tf_configs(free_ports(config.workers))] if distributed else [base]
    command = [sys.executable, "-m", "qml_ray.bench.baseline", "--worker", run]
    workers = [subprocess.Popen(command, env=env) for env in envs]
    try:
        while True:
            codes = [worker.poll() for worker in workers]
            for rank, code in enumerate(codes):
                if code:
                    raise SystemExit(f"error: baseline worker {rank} failed with exit status {code}")
            if all(code == 0 for code in codes):
                return
            time.sleep(0.5)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def work(run: str) -> None:
    """One worker: the strategy first (TF_CONFIG, if set, makes it a multi-worker one), then training."""
    import tensorflow as tf

    config = config_lib.of_run(run)
    spec = json.loads(os.environ.get("TF_CONFIG") or "null")
    if spec:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank, world_size = spec["task"]["index"], len(spec["cluster"]["worker"])
    else:
        strategy, rank, world_size = tf.distribute.get_strategy(), 0, 1
    from qml_ray import data  # after the strategy: importing TFQ starts TensorFlow's runtime
    from qml_ray.datasets import SPLITS, shard
    from qml_ray.worker import Job, build_replica, kept_inputs, train_replica

    tables = {split: data.read(run, split) for split in SPLITS}
    shards = {split: shard(table, rank, world_size) for split, table in tables.items()}
    rows = {split: table.num_rows for split, table in tables.items()}
    job = Job(config=config, run=run, rows=rows, label_width=1, in_memory=True)
    model = build_replica(job, strategy, rank, local_rank=rank)
    train_replica(job, model, strategy, kept_inputs(job, model, shards, rank, world_size), rank)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        work(args.worker)
        return
    if not args.name:
        raise UsageError("--name is required")
    config = cli.config_from_args(args)
    if args.no_distribution and config.workers != 1:
        raise UsageError("--no-distribution trains one process: give --workers 1")
    run = storage.run_dir(config.storage, args.name)
    if storage.exists(run):
        raise UsageError(f"run folder {run} already exists: choose another --name")
    print(f"run folder: {run}", flush=True)
    from qml_ray import data

    data.write(config, run)
    storage.write_text(storage.join(run, storage.CONFIG), config.to_yaml())
    launch(config, run, distributed=not args.no_distribution)
    print(f"trained {config.epochs} epochs on {config.workers} baseline worker(s)", flush=True)


if __name__ == "__main__":
    cli.run(main)
