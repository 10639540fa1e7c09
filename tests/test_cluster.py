"""KubeRay manifests: rendered from the configs, validated against the KubeRay 1.7 CRDs and
Kubernetes' own schemas, checked for the operator's rules, for restricted pods, Ray's token
and network policies, and scanned with checkov."""

import functools
import json
import os
import re
import subprocess
import tomllib
from importlib.metadata import version
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import ray
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from qml_ray import cluster, config as config_lib, hardening

from conftest import ROOT, require, run_command

# the Ray the project pins, written by hand: the rendered clusters must run the same
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
[PINNED_RAY] = [
    str(pin.specifier).removeprefix("==")
    for pin in map(Requirement, PYPROJECT["project"]["dependencies"])
    if pin.name == "ray"
]

CRDS = Path(os.environ.get("KUBERAY_CRDS", ROOT.parent / "shared" / "kuberay-crds"))
CHECKOV = Path(os.environ.get("CHECKOV", ROOT / ".venv-checkov" / "bin" / "checkov"))
CHECKOV_PIN = PYPROJECT["dependency-groups"]["checkov"][0]
CHECKOV_ACCEPTED = ROOT / "cluster" / "checkov-accepted.yaml"
CHECKED_IN = ROOT / "cluster" / "qcnn-23q.yaml"
# The documented defaults that cluster/qcnn-23q.yaml is rendered with (see docs/gke.md).
DEFAULTS = {
    "image": "us-central1-docker.pkg.dev/my-project/qml-ray/qml-ray:0.1.0@sha256:" + "0123456789abcdef" * 4,
    "bucket": "my-project-qml-ray",
    "project": "my-project",
    "name": "qcnn",
}
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
KUBERNETES_VERSION = "1.33"


def strict(schema):
    """The schema with unknown fields rejected wherever it lists its fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        schema.get("type") == "object"
        and isinstance(schema.get("properties"), dict)
        and not schema.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in schema
    ):
        out["additionalProperties"] = False
    return out


def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    require(
        CRDS.is_dir(),
        f"no KubeRay CRDs in {CRDS}: point KUBERAY_CRDS at the folder ray-operator/config/crd/"
        "bases of the KubeRay v1.7.0 release (github.com/ray-project/kuberay)",
    )
    return _crd_validator(kind)


@functools.cache
def _crd_validator(kind: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((CRDS / f"ray.io_{kind.lower()}s.yaml").read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))


def rendered(config_name: str, **changes) -> list[dict]:
    path = f"configs/{config_name}.yaml"
    config = config_lib.load(ROOT / path)
    if changes:
        config = config.replace(**changes)
    return cluster.render(path, config, **DEFAULTS)


def all_manifests() -> list[tuple[str, dict]]:
    """The checked-in manifests and renders of several configs and sizes."""
    found = [("checked-in", doc) for doc in yaml.safe_load_all(CHECKED_IN.read_text())]
    for name, workers in [("smoke", 2), ("tutorial", 4), ("qcnn-23q", 8), ("qcnn-23q", 64), ("qcnn-23q", "32-47")]:
        found += [(f"{name}x{workers}", doc) for doc in rendered(name, workers=workers)]
    return found + [("serving", doc) for doc in serving()]


def serving() -> list[dict]:
    """The smoke config's manifests with a RayService of 1 to 3 replicas (`--serve 1-3`)."""
    path = "configs/smoke.yaml"
    config = config_lib.load(ROOT / path)
    where = {key: DEFAULTS[key] for key in ("image", "bucket", "name")}
    return cluster.render(path, config, **DEFAULTS) + cluster.served(
        config, **where, namespace=cluster.NAMESPACE, replicas="1-3"
    )


MANIFESTS = all_manifests()
RAY = [(label, doc) for label, doc in MANIFESTS if doc["apiVersion"] == "ray.io/v1"]
CORE = [(label, doc) for label, doc in MANIFESTS if doc["apiVersion"] != "ray.io/v1"]


def ids(manifests: list[tuple[str, dict]]) -> list[str]:
    return [f"{label}-{doc['kind']}-{doc['metadata']['name']}" for label, doc in manifests]


def cluster_specs(doc: dict) -> list[dict]:
    spec = doc["spec"]
    return [{"RayCluster": spec, "RayService": spec.get("rayClusterConfig")}.get(doc["kind"]) or spec["rayClusterSpec"]]


def pod_templates(doc: dict) -> list[dict]:
    """The pod templates of a manifest: a Ray cluster's head and worker groups (and a RayJob's
    submitter), a Deployment's pods."""
    if doc["kind"] == "Deployment":
        return [doc["spec"]["template"]]
    if doc["apiVersion"] != "ray.io/v1":
        return []
    spec = cluster_specs(doc)[0]
    submitter = [doc["spec"]["submitterPodTemplate"]] if doc["kind"] == "RayJob" else []
    return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"]), *submitter]


def as_pod(doc: dict, template: dict) -> dict:
    """A pod template as the Pod made from it (in its resource's namespace, named after its container)."""
    name = f"{doc['metadata']['name']}-{template['spec']['containers'][0]['name']}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template.get("metadata", {}), "name": name, "namespace": doc["metadata"]["namespace"]},
        "spec": template["spec"],
    }


def test_checked_in_manifests_are_the_render_of_the_documented_defaults():
    flags = [f"--{key}={value}" for key, value in DEFAULTS.items()]
    args = cluster.parse_args(["render", "--config", "configs/qcnn-23q.yaml", *flags])
    header = cluster.header(args, config_lib.load(ROOT / args.config))
    assert CHECKED_IN.read_text() == cluster.to_yaml(rendered("qcnn-23q"), header)


def test_rendered_files_open_with_the_command_config_and_version_that_wrote_them():
    lines = CHECKED_IN.read_text().splitlines()[:4]
    assert lines[0].startswith("# Generated")
    command = "python -m qml_ray.cluster render --config configs/qcnn-23q.yaml --workers 47 "
    assert lines[1].startswith(f"# command: {command}")
    assert lines[2] == "# config: configs/qcnn-23q.yaml"
    assert lines[3] == f"# version: qml_ray {version('qml-ray')}, Ray {ray.__version__}"


@pytest.mark.parametrize("label, doc", RAY, ids=ids(RAY))
def test_ray_manifests_validate_against_the_kuberay_crds(label, doc):
    errors = [e.message for e in crd_validator(doc["kind"]).iter_errors(doc)]
    assert errors == []


def test_the_crd_check_rejects_unknown_fields_and_wrong_types():
    doc = next(d for d in rendered("smoke") if d["kind"] == "RayCluster")
    doc["spec"]["workerGroupSpecs"][0]["maxReplica"] = 3
    doc["spec"]["headGroupSpec"]["rayStartParams"] = "num-cpus=0"
    messages = " ".join(e.message for e in crd_validator("RayCluster").iter_errors(doc))
    assert "'maxReplica' was unexpected" in messages and "is not of type 'object'" in messages


@pytest.mark.parametrize("label, doc", CORE, ids=ids(CORE))
def test_core_manifests_validate_against_kubernetes_schemas(label, doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_kubernetes_check_rejects_unknown_fields():
    service = next(d for d in rendered("smoke") if d["kind"] == "Service")
    service["spec"]["prot"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("label, doc", RAY, ids=ids(RAY))
def test_operator_rules(label, doc):
    name, spec = doc["metadata"]["name"], doc["spec"]
    assert DNS_1035.match(name)
    assert len(name) <= (53 if doc["kind"] == "RayCluster" else 47)
    if doc["kind"] == "RayJob":
        assert "ttlSecondsAfterFinished" not in spec or spec["shutdownAfterJobFinishes"] is True
        assert spec["activeDeadlineSeconds"] > 0 and spec["submitterConfig"]["backoffLimit"] >= 0
    for cluster_spec in cluster_specs(doc):
        assert cluster_spec["rayVersion"] == PINNED_RAY
        assert cluster_spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
        for group in cluster_spec["workerGroupSpecs"]:
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
            worker = group["template"]["spec"]
            assert worker["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
            assert worker["tolerations"][0]["key"] == "cloud.google.com/gke-spot"
            resources = worker["containers"][0]["resources"]
            assert resources["requests"] == resources["limits"]
        for pod in [cluster_spec["headGroupSpec"]["template"]["spec"]] + [
            g["template"]["spec"] for g in cluster_spec["workerGroupSpecs"]
        ]:
            assert pod["serviceAccountName"] == cluster.SERVICE_ACCOUNT
            assert pod["nodeSelector"]["iam.gke.io/gke-metadata-server-enabled"] == "true"


def test_training_job_runs_the_config_it_was_rendered_from():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in rendered("qcnn-23q")}
    job = docs["RayJob", "qcnn-train"]
    entrypoint = job["spec"]["entrypoint"]
    assert entrypoint.startswith(
        f"python -m qml_ray.train --config {cluster.IMAGE_HOME}/configs/qcnn-23q.yaml --workers 47 "
    )
    assert "--storage gs://my-project-qml-ray/runs" in entrypoint
    assert entrypoint.endswith("--name qcnn --resume")  # a retried job continues the run
    assert job["spec"]["backoffLimit"] >= 1
    assert docs["RayCluster", "qcnn-cluster"]["spec"]["workerGroupSpecs"][0]["maxReplicas"] == 47
    assert ("Deployment", "qcnn-tensorboard") in docs
    service = docs["Service", "qcnn-tensorboard"]
    assert service["spec"]["type"] == "ClusterIP"


def test_an_elastic_training_job_keeps_its_cluster_between_the_fewest_and_the_most_workers():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in rendered("qcnn-23q", workers="32-47")}
    job = docs["RayJob", "qcnn-train"]
    assert " --workers 32-47 " in job["spec"]["entrypoint"]
    [group] = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (32, 32, 47)
    [idle] = docs["RayCluster", "qcnn-cluster"]["spec"]["workerGroupSpecs"]  # a cluster between jobs holds none
    assert (idle["minReplicas"], idle["maxReplicas"]) == (0, 47)


def test_training_job_carries_the_users_model_data_and_params():
    options = ("--model", "mymodels:classifier", "--data", "gs://my-project-qml-ray/circuits", "--param", "depth=3")
    path = "configs/smoke.yaml"
    manifests = cluster.render(path, config_lib.load(ROOT / path), **DEFAULTS, train_options=options)
    docs = {(d["kind"], d["metadata"]["name"]): d for d in manifests}
    assert docs["RayJob", "qcnn-train"]["spec"]["entrypoint"].endswith(
        "--name qcnn --resume --model mymodels:classifier --data gs://my-project-qml-ray/circuits --param depth=3"
    )


def test_the_ray_service_serves_the_runs_weights_from_cloud_storage_to_its_clients_only():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in serving()}
    service = docs["RayService", "qcnn-serve"]["spec"]
    config = yaml.safe_load(service["serveConfigV2"])
    assert config["http_options"] == {"host": "0.0.0.0", "port": cluster.SERVE_PORT}
    [application] = config["applications"]
    assert application["import_path"] == "qml_ray.serve:app"
    assert application["args"] == {"run": "gs://my-project-qml-ray/runs/qcnn", "replicas": "1-3"}
    [workers] = service["rayClusterConfig"]["workerGroupSpecs"]
    assert (workers["minReplicas"], workers["maxReplicas"]) == (0, 3)
    head = service["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"containerPort": cluster.SERVE_PORT, "name": "serve"} in head["ports"]
    ingress = docs["NetworkPolicy", "qcnn-serve"]["spec"]["ingress"]
    clients = {"podSelector": {"matchLabels": {cluster.SERVE_CLIENT: "qcnn-serve"}}}
    assert ingress[2] == {"from": [clients], "ports": [{"protocol": "TCP", "port": cluster.SERVE_PORT}]}
    assert ingress[0] == {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "qcnn-serve"}}}]}
    assert ("RayService", "qcnn-serve") not in {(d["kind"], d["metadata"]["name"]) for d in rendered("smoke")}


def test_render_serve_asks_for_a_replica_count(in_process):
    flags = [f"--{k}={v}" for k, v in DEFAULTS.items()]
    done = in_process("cluster", "render", "--config", "configs/smoke.yaml", *flags, "--serve", "3-1")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "error: --serve must be at least 1, and MIN at most MAX, got '3-1'\n"


def test_image_and_project_use_the_same_ray_and_python():
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    [python] = re.findall(r"^ARG PYTHON=py3(\d+)$", dockerfile, re.MULTILINE)  # the default; any supported one
    assert f"3.{python}" in SpecifierSet(PYPROJECT["project"]["requires-python"])
    base = f"rayproject/ray:{ray.__version__}-${{PYTHON}}-cpu"
    assert dockerfile.count(f"\nFROM {base}") == 2
    assert f"WORKDIR {cluster.IMAGE_HOME}" in dockerfile and "COPY --chown=ray:users configs ./configs" in dockerfile
    assert dockerfile.rstrip().endswith("\nUSER 1000:100")  # the pods' runAsUser and runAsGroup
    builder, image = dockerfile.split("\nFROM ")[-2:]  # the kernel compiled in a builder stage, no compiler after
    assert "install -y --no-install-recommends g++" in builder and "pip wheel" in builder
    assert image.startswith(f"{base}\n") and "--from=builder" in image
    assert "g++" not in image.replace("command -v g++", "")
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if not line.startswith("#")]
    assert ignored[0] == "*" and all(line.startswith(("!", "**/")) for line in ignored[1:])  # an allow-list
    assert ray.__version__ == PINNED_RAY


def test_render_command_prints_or_writes_the_manifests(tmp_path):
    render = ("cluster", "render", "--config", "configs/qcnn-23q.yaml", "--workers", "47")
    render += tuple(f"--{k}={v}" for k, v in DEFAULTS.items())
    done = run_command(*render)
    assert done.returncode == 0, done.stderr
    assert done.stdout == CHECKED_IN.read_text()
    out = tmp_path / "rendered"
    written = run_command(*render, "--out", out)
    assert written.returncode == 0, written.stderr
    files = {p.name: list(yaml.safe_load_all(p.read_text())) for p in out.iterdir()}
    assert sorted(files) == [
        "qcnn-cluster.yaml",
        "qcnn-infer.yaml",
        "qcnn-tensorboard.yaml",
        "qcnn-train.yaml",
        "qml-ray.yaml",
    ]
    assert [d["kind"] for d in files["qcnn-tensorboard.yaml"]] == ["NetworkPolicy", "Deployment", "Service"]
    assert [d["kind"] for d in files["qcnn-cluster.yaml"]] == ["NetworkPolicy", "RayCluster"]
    assert [d["kind"] for d in files["qml-ray.yaml"]] == ["Namespace", "ServiceAccount"]

    def key(doc):
        return doc["kind"], doc["metadata"]["name"]

    written_docs = [doc for group in files.values() for doc in group]
    assert sorted(written_docs, key=key) == sorted(yaml.safe_load_all(CHECKED_IN.read_text()), key=key)
    bad = run_command(
        "cluster",
        "render",
        "--config",
        "configs/qcnn-23q.yaml",
        "--workers",
        "0",
        *[f"--{k}={v}" for k, v in DEFAULTS.items()],
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: workers must be at least 1"


def test_render_asks_for_an_image_pinned_by_digest_and_a_namespace():
    flags = [f"--{k}={v}" for k, v in DEFAULTS.items() if k != "image"]
    tagged = run_command("cluster", "render", "--config", "configs/smoke.yaml", "--image", "qml-ray:0.1.0", *flags)
    assert tagged.returncode == 2 and tagged.stdout == ""
    assert tagged.stderr == (
        "error: --image must name the image by digest, REPOSITORY[:TAG]@sha256:<64 hex digits>: 'qml-ray:0.1.0'\n"
    )
    named = run_command(
        "cluster",
        "render",
        "--config",
        "configs/smoke.yaml",
        "--image",
        DEFAULTS["image"],
        "--namespace",
        "QML_Ray",
        *flags,
    )
    assert named.returncode == 2 and named.stderr.startswith("error: --namespace must be a DNS label")
    digest = "sha256:" + "0a" * 32
    for image in [f"qml-ray@{digest}", f"localhost:5000/team/qml_ray:v1.2@{digest}", DEFAULTS["image"]]:
        assert hardening.PINNED_IMAGE.fullmatch(image)
    for image in [
        "qml-ray:0.1.0",
        "qml-ray@sha256:abc123",
        f"qml-ray@sha512:{'0' * 64}",
        f"QML-RAY@{digest}",
        f"@{digest}",
        f"qml ray@{digest}",
        f"qml-ray@{digest} ",
    ]:
        assert not hardening.PINNED_IMAGE.fullmatch(image)


RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 100,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}  # the volume types the restricted Pod Security Standard allows
API_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
PODS = [(label, doc) for label, doc in MANIFESTS if pod_templates(doc)]


@pytest.mark.parametrize("label, doc", PODS, ids=ids(PODS))
def test_every_pod_is_restricted_and_has_no_api_token(label, doc):
    templates = pod_templates(doc)
    assert len(templates) == {"RayCluster": 2, "RayJob": 3, "RayService": 2, "Deployment": 1}[doc["kind"]]
    for template in templates:
        spec = template["spec"]
        assert spec["securityContext"] == RESTRICTED_POD and spec["automountServiceAccountToken"] is False
        assert not {"hostNetwork", "hostPID", "hostIPC"} & spec.keys()
        for volume in spec["volumes"]:
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES
        for container in spec["containers"]:
            assert container["securityContext"] == RESTRICTED_CONTAINER
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert {"/tmp", "/home/ray/.cache"} <= mounts and API_TOKEN_PATH not in mounts
    for cluster_spec in cluster_specs(doc) if doc["apiVersion"] == "ray.io/v1" else []:
        autoscaler = cluster_spec["autoscalerOptions"]  # the sidecar KubeRay adds to the head: the API's only client
        assert cluster_spec["enableInTreeAutoscaling"] and autoscaler["securityContext"] == RESTRICTED_CONTAINER
        (token,) = [m for m in autoscaler["volumeMounts"] if m["mountPath"] == API_TOKEN_PATH]
        head = cluster_spec["headGroupSpec"]["template"]["spec"]
        (volume,) = [v for v in head["volumes"] if v["name"] == token["name"]]
        assert token["readOnly"] and {"serviceAccountToken": {"path": "token"}} in volume["projected"]["sources"]


@pytest.mark.parametrize("label, doc", RAY, ids=ids(RAY))
def test_ray_asks_for_its_token(label, doc):
    for cluster_spec in cluster_specs(doc):
        assert cluster_spec["authOptions"] == {"mode": "token"}


def test_only_a_clusters_own_pods_reach_it():
    docs = rendered("qcnn-23q", workers=8)
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert sorted(policies) == ["qcnn-cluster", "qcnn-infer", "qcnn-tensorboard", "qcnn-train"]
    operator = {
        "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}}],
        "ports": [{"protocol": "TCP", "port": 8265}],
    }  # follows a RayJob on the head's dashboard
    for doc in docs:
        if doc["kind"] not in {"RayCluster", "RayJob", "Deployment"}:
            continue
        policy = policies[doc["metadata"]["name"]]
        assert policy["policyTypes"] == ["Ingress"]
        selector = policy["podSelector"]["matchLabels"]
        for template in pod_templates(doc):
            assert selector.items() <= template["metadata"]["labels"].items()
        if doc["kind"] == "Deployment":
            assert policy["ingress"] == []  # TensorBoard: port-forward only
        else:
            own = {"from": [{"podSelector": {"matchLabels": selector}}]}
            assert policy["ingress"] == ([own, operator] if doc["kind"] == "RayJob" else [own])
    assert all(d["metadata"]["namespace"] == "qml-ray" for d in docs if d["kind"] != "Namespace")
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def runs(manifest: dict) -> str:
    """What a scanned manifest runs: its pod's first container (a Pod's, a Deployment's), or else its kind."""
    if manifest["kind"] not in {"Pod", "Deployment"}:
        return manifest["kind"]
    pod = manifest if manifest["kind"] == "Pod" else manifest["spec"]["template"]
    return pod["spec"]["containers"][0]["name"]


def test_checkov_finds_nothing_but_the_accepted(tmp_path):
    """checkov over every rendered manifest, and each Ray pod template as a Pod (checkov does not look
    into Ray's resources): no failed check but those in cluster/checkov-accepted.yaml, each still needed."""
    require(CHECKOV.exists(), f"no checkov at {CHECKOV}: install it as docs/testing.md says, or set CHECKOV")
    scanned = {}
    for index, (label, doc) in enumerate(MANIFESTS):
        pods = [as_pod(doc, template) for template in pod_templates(doc) if doc["kind"] != "Deployment"]
        for number, manifest in enumerate([doc, *pods]):
            path = tmp_path / f"{label}-{index:03d}-{number}.yaml"
            path.write_text(yaml.safe_dump(manifest))
            scanned[f"/{path.name}"] = runs(manifest)
    done = subprocess.run(
        [
            CHECKOV,
            "--directory",
            tmp_path,
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--soft-fail",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    version = report["summary"]["checkov_version"]
    require(f"checkov=={version}" == CHECKOV_PIN, f"checkov {version} at {CHECKOV}, the tests need {CHECKOV_PIN}")
    failed = [(f["check_id"], scanned[f["file_path"]], f["resource"]) for f in report["results"]["failed_checks"]]
    accepted = {
        (entry["check"], pod) for entry in yaml.safe_load(CHECKOV_ACCEPTED.read_text()) for pod in entry["pods"]
    }
    assert [f for f in failed if f[:2] not in accepted] == []
    assert accepted == {f[:2] for f in failed}
