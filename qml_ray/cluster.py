"""`python -m qml_ray.cluster render`: the KubeRay manifests for a config, on GKE.

The same config that drives a laptop run sizes the cluster: one Ray worker pod per
training worker, `cpus_per_worker` CPUs each, on spot nodes; the head runs no work
(num-cpus 0) on an on-demand node. Every pod that reads the bucket runs as the Workload
Identity service account, so the bucket is reached without key files; every pod is
restricted, and Ray asks for its token (see `hardening`).
"""

import re
import shlex
import sys
from importlib.metadata import version
from pathlib import Path

import yaml

from qml_ray import cli, config as config_lib, hardening, serve, storage
from qml_ray.errors import UsageError

RAY_VERSION = version("ray")
QML_RAY_VERSION = version("qml-ray")
NAMESPACE = "qml-ray"
SERVICE_ACCOUNT = "qml-ray"
IMAGE_HOME = "/home/ray/qml_ray"  # where cluster/Dockerfile puts the project (and its configs)
HEAD_POOL = "ray-head"  # on-demand node pool for the Ray head and TensorBoard
WORKLOAD_IDENTITY = {"iam.gke.io/gke-metadata-server-enabled": "true"}
SPOT = {"cloud.google.com/gke-spot": "true"}
TRAIN_DEADLINE_SECONDS = 6 * 3600
INFER_DEADLINE_SECONDS = 3600
FINISHED_TTL_SECONDS = 600
TRAIN_JOB_RETRIES = 3  # whole-job reruns (new cluster, resumed from the checkpoints) after a failure
MEMORY_PER_CPU_GI = 3  # 15 CPUs and 45Gi fit the allocatable share of a 16-vCPU, 64 GB node
SERVE_PORT = 8000  # Serve's HTTP proxy, on every node of a RayService's cluster
SERVE_CLIENT = "qml-ray/serve-client"  # the label of the pods that may send a RayService requests
SUBMITTER_RESOURCES = {"cpu": "500m", "memory": "1Gi"}  # `ray job submit` and `ray job logs`
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# The resources take the run's name plus a suffix (-cluster, -train, -infer, -serve, -tensorboard);
# KubeRay wants a RayCluster name of at most 53 characters, a RayJob's or RayService's of 47 (it adds 6
# for the cluster it makes), and each to be a DNS-1035 label (starting with a letter).
NAME_SUFFIXES = {"RayCluster": ("-cluster", 53), "RayJob": ("-train", 47), "RayService": ("-serve", 47)}
MAX_NAME = min(limit - len(suffix) for suffix, limit in NAME_SUFFIXES.values())
RUN_NAME = re.compile(rf"[a-z]([-a-z0-9]{{0,{MAX_NAME - 2}}}[a-z0-9])?")


def check_names(name: str, bucket: str) -> None:
    """A UsageError unless Kubernetes and KubeRay take the resources named after `name`, and Cloud
    Storage takes `bucket` as a bucket name."""
    if not RUN_NAME.fullmatch(name):
        raise UsageError(
            f"--name must be 1-{MAX_NAME} characters of a-z, 0-9 and '-', starting with a letter and not ending "
            f"with '-' (KubeRay's limits for the RayCluster and RayJobs named after it): {name!r}"
        )
    parts = bucket.split(".")
    if not (
        re.fullmatch(r"[a-z0-9][a-z0-9._-]*[a-z0-9]", bucket)
        and 3 <= len(bucket) <= (222 if len(parts) > 1 else 63)
        and all(0 < len(part) <= 63 for part in parts)
        and not bucket.startswith("goog")
        and "google" not in bucket
        and not re.fullmatch(r"[0-9.]+", bucket)  # an IP address
    ):
        raise UsageError(
            f"--bucket must be a Cloud Storage bucket name: 3-63 characters of a-z, 0-9, '-', '_' and '.' "
            f"(222 with dots, 63 between them), starting and ending with a letter or digit, not an IP address, "
            f"no 'goog' prefix and no 'google': {bucket!r}"
        )


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.cluster", description="Render the KubeRay manifests (GKE) for a config."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    render = commands.add_parser("render", help="print the manifests as YAML")
    render.add_argument("--config", metavar="YAML", required=True, help="the run's config file")
    render.add_argument("--workers", metavar="N|MIN-MAX", help="training workers (default: the config's)")
    render.add_argument(
        "--image",
        required=True,
        help="the qml_ray image (see cluster/Dockerfile) by digest: REPOSITORY[:TAG]@sha256:DIGEST",
    )
    render.add_argument("--bucket", required=True, help="Cloud Storage bucket for the runs")
    render.add_argument("--project", default="PROJECT_ID", help="Google Cloud project (for Workload Identity)")
    render.add_argument("--namespace", default=NAMESPACE, help=f"Kubernetes namespace (default: {NAMESPACE})")
    render.add_argument("--name", default="qcnn", help="name of the run and prefix of the resources")
    render.add_argument("--out", metavar="DIR", help="write DIR/<resource name>.yaml files instead of printing")
    render.add_argument("--model", metavar="MODULE:FUNCTION", help="the model function (default: the config's)")
    render.add_argument("--data", metavar="gs://...", help="the training data (default: the config's)")
    render.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="a parameter of the model function"
    )
    render.add_argument(
        "--serve",
        metavar="N|MIN-MAX",
        help="also a RayService serving the run's final weights with N model replicas, or MIN to MAX as "
        "requests wait (python -m qml_ray.serve on GKE)",
    )
    return parser.parse_args(argv)


def model_options(args) -> list[str]:
    """The training entrypoint's --model, --data and --param flags, as given (checked first)."""
    cli.params_given(args)
    if args.model:
        config_lib.parse_model(args.model)
    if args.data:
        storage.check_location(args.data)
    given = [("--model", args.model), ("--data", args.data), *(("--param", spec) for spec in args.param)]
    return [text for flag, value in given if value for text in (flag, value)]


def pod_spec(image: str, cpus: int, node_selector: dict, container: dict, volumes: tuple = ()) -> dict:
    """A restricted pod on the given nodes, as the Workload Identity service account, requests equal to limits."""
    resources = {"cpu": str(cpus), "memory": f"{cpus * MEMORY_PER_CPU_GI}Gi"}
    spec = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "nodeSelector": {**WORKLOAD_IDENTITY, **node_selector},
        "containers": [
            hardening.container(
                {
                    "name": container["name"],
                    "image": image,
                    "resources": {"requests": resources, "limits": resources},
                    "env": [{"name": "TF_USE_LEGACY_KERAS", "value": "1"}],
                    **container,
                }
            )
        ],
        "volumes": list(volumes),
    }
    if node_selector == SPOT:
        spec["tolerations"] = [
            {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        ]
    return hardening.pod(spec)


def template(name: str, spec: dict) -> dict:
    """A pod template of the Ray cluster `name` (its label is what its network policy selects)."""
    return {"metadata": {"labels": {hardening.INSTANCE: name}}, "spec": spec}


def ray_cluster_spec(name: str, image: str, cpus_per_worker: int, workers: tuple[int, int]) -> dict:
    """Head on an on-demand node (no work on it), autoscaled CPU workers on spot nodes, from the first
    to the second of `workers` (one a node); Ray's dashboard and job API ask for the token in the Secret
    KubeRay makes for the cluster."""
    head = pod_spec(
        image,
        2,
        {"cloud.google.com/gke-nodepool": HEAD_POOL},
        {
            "name": "ray-head",
            "ports": [
                {"containerPort": 6379, "name": "gcs"},
                {"containerPort": hardening.DASHBOARD_PORT, "name": "dashboard"},
                {"containerPort": 10001, "name": "client"},
            ],
        },
        volumes=[hardening.api_token_volume()],  # mounted in the autoscaler's container only
    )
    worker = pod_spec(
        image,
        cpus_per_worker,
        SPOT,
        {
            "name": "ray-worker",
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        },
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    )
    return {
        "rayVersion": RAY_VERSION,
        "authOptions": {"mode": "token"},
        "enableInTreeAutoscaling": True,
        "autoscalerOptions": {
            "upscalingMode": "Default",
            "idleTimeoutSeconds": 120,
            **hardening.autoscaler_container(),
        },
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
            "template": template(name, head),
        },
        "workerGroupSpecs": [
            {
                "groupName": "cpu",
                "replicas": workers[0],
                "minReplicas": workers[0],
                "maxReplicas": workers[1],
                "rayStartParams": {},
                "template": template(name, worker),
            }
        ],
    }


def service_account(project: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": SERVICE_ACCOUNT,
            "annotations": {"iam.gke.io/gcp-service-account": f"{SERVICE_ACCOUNT}@{project}.iam.gserviceaccount.com"},
        },
        "automountServiceAccountToken": False,
    }


def submitter(name: str, image: str) -> dict:
    """The pod that runs `ray job submit` (KubeRay adds its command and the token): restricted, and
    with no identity of its own, Google's or Kubernetes'."""
    resources = {"requests": SUBMITTER_RESOURCES, "limits": SUBMITTER_RESOURCES}
    return template(
        name,
        hardening.pod(
            {
                "restartPolicy": "Never",
                "containers": [
                    hardening.container({"name": "ray-job-submitter", "image": image, "resources": resources})
                ],
            }
        ),
    )


def ray_cluster(name: str, cluster: dict) -> list[dict]:
    """A RayCluster, with its network policy."""
    return [
        hardening.ray_network_policy(name, job=False),
        {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name}, "spec": cluster},
    ]


def ray_job(name: str, entrypoint: str, cluster: dict, deadline: int, retries: int) -> list[dict]:
    """A RayJob that owns its cluster (made for the job, deleted after it), with its network
    policy. A failed job is run again `retries` times, each time on a new cluster; a failed
    `ray job submit` pod (not the job) is retried twice."""
    image = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    return [
        hardening.ray_network_policy(name, job=True),
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": {"name": name},
            "spec": {
                "entrypoint": entrypoint,
                "activeDeadlineSeconds": deadline,
                "backoffLimit": retries,
                "submitterConfig": {"backoffLimit": 2},
                "submitterPodTemplate": submitter(name, image),
                "shutdownAfterJobFinishes": True,
                "ttlSecondsAfterFinished": FINISHED_TTL_SECONDS,
                "rayClusterSpec": cluster,
            },
        },
    ]


def tensorboard(name: str, image: str, logdir: str) -> list[dict]:
    """TensorBoard on the run's gs:// logs, reached only through kubectl port-forward."""
    labels = {"app": f"{name}-tensorboard"}
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6}
    spec = pod_spec(
        image,
        1,
        {"cloud.google.com/gke-nodepool": HEAD_POOL},
        {
            "name": "tensorboard",
            "ports": [{"containerPort": 6006, "name": "http"}],
            "command": ["tensorboard", "--logdir", logdir, "--host", "0.0.0.0", "--port", "6006"],
            "livenessProbe": probe,
            "readinessProbe": probe,
        },
    )
    return [
        hardening.network_policy(f"{name}-tensorboard", labels),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"{name}-tensorboard"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": spec},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{name}-tensorboard"},
            "spec": {"type": "ClusterIP", "selector": labels, "ports": [{"port": 6006, "targetPort": 6006}]},
        },
    ]


def ray_service(name: str, cluster: dict, run: str, replicas: str) -> list[dict]:
    """A RayService serving `run` (`qml_ray.serve:app`, its weights read from Cloud Storage) on HTTP port
    SERVE_PORT, with its network policy: the cluster's own pods, the KubeRay operator on the dashboard
    (it deploys the Serve config and follows it there), and on SERVE_PORT the pods labelled SERVE_CLIENT: name."""
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["ports"] = [*head["ports"], {"containerPort": SERVE_PORT, "name": "serve"}]
    application = {"name": serve.APPLICATION, "route_prefix": "/", "import_path": "qml_ray.serve:app"}
    serve_config = {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": SERVE_PORT},
        "applications": [{**application, "args": {"run": run, "replicas": replicas}}],
    }
    own = {hardening.INSTANCE: name}
    policy = hardening.network_policy(
        name,
        own,
        {"from": [{"podSelector": {"matchLabels": own}}]},
        {
            "from": [{"podSelector": {"matchLabels": hardening.OPERATOR}}],
            "ports": [{"protocol": "TCP", "port": hardening.DASHBOARD_PORT}],
        },
        {
            "from": [{"podSelector": {"matchLabels": {SERVE_CLIENT: name}}}],
            "ports": [{"protocol": "TCP", "port": SERVE_PORT}],
        },
    )
    service = {"serveConfigV2": yaml.safe_dump(serve_config, sort_keys=False), "rayClusterConfig": cluster}
    return [policy, {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name}, "spec": service}]


def in_namespace(manifest: dict, namespace: str) -> dict:
    """The manifest of a namespaced resource, placed in `namespace`."""
    if manifest["kind"] == "Namespace":
        return manifest
    metadata = manifest["metadata"]
    return {**manifest, "metadata": {"name": metadata["name"], "namespace": namespace, **metadata}}


def render(
    config_path: str,
    config: config_lib.Config,
    *,
    image: str,
    bucket: str,
    project: str,
    name: str,
    namespace: str = NAMESPACE,
    train_options: tuple[str, ...] = (),
) -> list[dict]:
    """Every manifest: namespace, service account, RayCluster, training and inference RayJobs,
    TensorBoard, each Ray cluster and TensorBoard with its network policy (`served` adds a RayService).
    `train_options`: more flags for the training entrypoint (the model, its data and params)."""
    storage = f"gs://{bucket}/runs"
    run = f"{storage}/{name}"
    infer_workers = max(1, config.workers // 8)
    training = (config.min_workers if config.elastic else 0, config.workers)  # elastic: kept at least MIN
    specs = {
        part: ray_cluster_spec(f"{name}-{part}", image, config.cpus_per_worker, workers)
        for part, workers in [("cluster", (0, config.workers)), ("train", training), ("infer", (0, infer_workers))]
    }
    actors = infer_workers * config.cpus_per_worker  # an actor a CPU: Ray Data's reads take none
    # --resume: a retried job continues the run from its checkpoints (or starts it, the first time).
    train = (
        f"python -m qml_ray.train --config {IMAGE_HOME}/{config_path} --workers {config.worker_range} "
        f"--storage {storage} --name {name} --resume"
    ) + "".join(f" {shlex.quote(option)}" for option in train_options)
    infer = f"python -m qml_ray.infer --run {run} --actors {actors}"
    manifests = [
        hardening.namespace(namespace),
        service_account(project),
        *ray_cluster(f"{name}-cluster", specs["cluster"]),
        *ray_job(f"{name}-train", train, specs["train"], TRAIN_DEADLINE_SECONDS, TRAIN_JOB_RETRIES),
        *ray_job(f"{name}-infer", infer, specs["infer"], INFER_DEADLINE_SECONDS, 0),
        *tensorboard(name, image, f"{run}/tensorboard"),
    ]
    return [in_namespace(manifest, namespace) for manifest in manifests]


def served(config: config_lib.Config, *, image: str, bucket: str, name: str, namespace: str, replicas: str) -> list:
    """The RayService serving the run `name` (its weights on Cloud Storage) on `replicas` (N or MIN-MAX)
    replicas, with its network policy, in `namespace`."""
    most = serve.replica_range(replicas, "--serve")[1]
    spec = ray_cluster_spec(f"{name}-serve", image, config.cpus_per_worker, (0, most))
    service = ray_service(f"{name}-serve", spec, f"gs://{bucket}/runs/{name}", replicas)
    return [in_namespace(manifest, namespace) for manifest in service]


class PlainDumper(yaml.SafeDumper):
    """YAML for kubectl: shared parts are written out in full, not as anchors and aliases."""

    def ignore_aliases(self, data):
        return True


def to_yaml(manifests: list[dict], header: str = "") -> str:
    return header + yaml.dump_all(manifests, Dumper=PlainDumper, sort_keys=False, width=200)


def header(args, config: config_lib.Config) -> str:
    """The comment that opens every rendered file: generated, and by which command, config and version
    (the command spelled out in full, whatever defaults and spelling it was given with)."""
    options = [
        ("--config", args.config),
        ("--workers", config.worker_range),
        ("--image", args.image),
        ("--bucket", args.bucket),
        ("--project", args.project),
        ("--namespace", args.namespace),
        ("--name", args.name),
        *((flag, value) for flag, value in [("--model", args.model), ("--data", args.data)] if value),
        *(("--param", spec) for spec in args.param),
        *([("--serve", args.serve)] if args.serve else []),
    ]
    command = shlex.join(["python", "-m", "qml_ray.cluster", "render", *(str(x) for o in options for x in o)])
    return (
        "# Generated: render again rather than edit.\n"
        f"# command: {command}\n"
        f"# config: {args.config}\n"
        f"# version: qml_ray {QML_RAY_VERSION}, Ray {RAY_VERSION}\n"
    )


def write_files(manifests: list[dict], folder: str, header: str = "") -> list[Path]:
    """One file per resource name: a Ray cluster's network policy goes with it, TensorBoard's
    Deployment, Service and network policy share one, and so do the namespace and the service
    account when they share their name."""
    by_name: dict[str, list[dict]] = {}
    for manifest in manifests:
        by_name.setdefault(manifest["metadata"]["name"], []).append(manifest)
    Path(folder).mkdir(parents=True, exist_ok=True)
    paths = [Path(folder, f"{name}.yaml") for name in by_name]
    for path, group in zip(paths, by_name.values()):
        path.write_text(to_yaml(group, header))
    return paths


def main(argv=None) -> None:
    args = parse_args(argv)
    config = config_lib.load(args.config)
    if args.workers is not None:
        config = config_lib.from_mapping(config_lib.overlaid(config_lib.asdict(config), {"workers": args.workers}))
    if not hardening.PINNED_IMAGE.fullmatch(args.image):
        raise UsageError(
            f"--image must name the image by digest, REPOSITORY[:TAG]@sha256:<64 hex digits>: {args.image!r}"
        )
    if not DNS_LABEL.fullmatch(args.namespace):
        raise UsageError(f"--namespace must be a DNS label (lower-case letters, digits, '-'): {args.namespace!r}")
    check_names(args.name, args.bucket)
    if args.out:
        storage.check_local_folder(args.out)
    manifests = render(
        args.config,
        config,
        image=args.image,
        bucket=args.bucket,
        project=args.project,
        name=args.name,
        namespace=args.namespace,
        train_options=tuple(model_options(args)),
    )
    if args.serve:
        where = {"image": args.image, "bucket": args.bucket, "name": args.name, "namespace": args.namespace}
        manifests += served(config, **where, replicas=args.serve)
    comment = header(args, config)
    if args.out:
        try:
            paths = write_files(manifests, args.out, comment)
        except OSError as err:
            raise UsageError(f"cannot write the manifests to {args.out}: {err}") from None
        print(*paths, sep="\n")
    else:
        sys.stdout.write(to_yaml(manifests, comment))


if __name__ == "__main__":
    cli.run(main)
