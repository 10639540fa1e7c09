"""`ray job submit` on a real multi-node Ray cluster on this machine (scripts/local_cluster.sh):
a head that runs no work and two worker nodes of one CPU each, like the RayCluster on GKE."""

import json
import re

from conftest import SMOKE, ray_cli, submit


def test_training_and_inference_jobs_on_a_multi_node_cluster(cluster, tmp_path):
    url, env = cluster.url, cluster.env

    options = ("--config", SMOKE, "--workers", 2, "--storage", tmp_path, "--name", "smoke")
    train = submit(url, env, "qml_ray.train", *options)
    assert "succeeded" in ray_cli(env, "job", "status", train, "--address", url).lower()
    logs = ray_cli(env, "job", "logs", train, "--address", url)
    assert "epoch 6/6" in logs and "val_accuracy" in logs
    listing = "list actors --filter class_name=RayTrainWorker --detail --format json".split()
    actors = json.loads(ray_cli(env, *listing, "--address", url))
    assert len({actor["node_id"] for actor in actors}) == 2  # one training worker per worker node

    infer = submit(url, env, "qml_ray.infer", "--run", tmp_path / "smoke")
    assert "succeeded" in ray_cli(env, "job", "status", infer, "--address", url).lower()
    assert re.search(r"mse \d\.\d+  accuracy \d\.\d+", ray_cli(env, "job", "logs", infer, "--address", url))
    assert (tmp_path / "smoke" / "weights" / "_COMPLETE").is_file()
