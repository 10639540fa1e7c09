"""KubeRay manifests: rendered from the configs, validated against the KubeRay 1.7 CRDs and
Kubernetes' own schemas, and checked for the operator's rules."""

import os
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import ray
import yaml

from qml_ray import cluster, config as config_lib

from conftest import ROOT, run_command

CRDS = Path(os.environ.get("KUBERAY_CRDS", ROOT.parent / "shared" / "kuberay-crds"))
CHECKED_IN = ROOT / "cluster" / "qcnn-23q.yaml"
# The documented defaults that cluster/qcnn-23q.yaml is rendered with (see the README).
DEFAULTS = dict(image="us-central1-docker.pkg.dev/my-project/qml-ray/qml-ray:0.1.0",
                bucket="my-project-qml-ray", project="my-project", name="qcnn")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
KUBERNETES_VERSION = "1.33"


def strict(schema):
    """The schema with unknown fields rejected wherever it lists its fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (schema.get("type") == "object" and isinstance(schema.get("properties"), dict)
            and not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema):
        out["additionalProperties"] = False
    return out


def crd_validator(kind: str) -> jsonschema.Draft7Validator:
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
    for name, workers in [("smoke", 2), ("tutorial", 4), ("qcnn-23q", 8), ("qcnn-23q", 64)]:
        found += [(f"{name}x{workers}", doc) for doc in rendered(name, workers=workers)]
    return found


MANIFESTS = all_manifests()
RAY = [(label, doc) for label, doc in MANIFESTS if doc["apiVersion"] == "ray.io/v1"]
CORE = [(label, doc) for label, doc in MANIFESTS if doc["apiVersion"] != "ray.io/v1"]


def cluster_specs(doc: dict) -> list[dict]:
    return [doc["spec"]] if doc["kind"] == "RayCluster" else [doc["spec"]["rayClusterSpec"]]


def test_checked_in_manifests_are_the_render_of_the_documented_defaults():
    assert CHECKED_IN.read_text() == cluster.to_yaml(rendered("qcnn-23q", workers=32))


@pytest.mark.parametrize("label, doc", RAY, ids=[f"{l}-{d['metadata']['name']}" for l, d in RAY])
def test_ray_manifests_validate_against_the_kuberay_crds(label, doc):
    errors = [e.message for e in crd_validator(doc["kind"]).iter_errors(doc)]
    assert errors == []


def test_the_crd_check_rejects_unknown_fields_and_wrong_types():
    doc = rendered("smoke")[1]
    doc["spec"]["workerGroupSpecs"][0]["maxReplica"] = 3
    doc["spec"]["headGroupSpec"]["rayStartParams"] = "num-cpus=0"
    messages = " ".join(e.message for e in crd_validator("RayCluster").iter_errors(doc))
    assert "'maxReplica' was unexpected" in messages and "is not of type 'object'" in messages


@pytest.mark.parametrize("label, doc", CORE, ids=[f"{l}-{d['kind']}" for l, d in CORE])
def test_core_manifests_validate_against_kubernetes_schemas(label, doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_kubernetes_check_rejects_unknown_fields():
    service = [d for d in rendered("smoke") if d["kind"] == "Service"][0]
    service["spec"]["prot"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("label, doc", RAY, ids=[f"{l}-{d['metadata']['name']}" for l, d in RAY])
def test_operator_rules(label, doc):
    name, spec = doc["metadata"]["name"], doc["spec"]
    assert DNS_1035.match(name)
    assert len(name) <= (47 if doc["kind"] == "RayJob" else 53)
    if doc["kind"] == "RayJob":
        assert "ttlSecondsAfterFinished" not in spec or spec["shutdownAfterJobFinishes"] is True
        assert spec["activeDeadlineSeconds"] > 0 and spec["submitterConfig"]["backoffLimit"] >= 0
    for cluster_spec in cluster_specs(doc):
        assert cluster_spec["rayVersion"] == ray.__version__ == cluster.RAY_VERSION
        assert cluster_spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
        for group in cluster_spec["workerGroupSpecs"]:
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
            worker = group["template"]["spec"]
            assert worker["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
            assert worker["tolerations"][0]["key"] == "cloud.google.com/gke-spot"
            resources = worker["containers"][0]["resources"]
            assert resources["requests"] == resources["limits"]
        for pod in [cluster_spec["headGroupSpec"]["template"]["spec"]] + [
                g["template"]["spec"] for g in cluster_spec["workerGroupSpecs"]]:
            assert pod["serviceAccountName"] == cluster.SERVICE_ACCOUNT
            assert pod["nodeSelector"]["iam.gke.io/gke-metadata-server-enabled"] == "true"


def test_training_job_runs_the_config_it_was_rendered_from():
    docs = {d["metadata"]["name"]: d for d in rendered("qcnn-23q", workers=32)}
    entrypoint = docs["qcnn-train"]["spec"]["entrypoint"]
    assert entrypoint.startswith(f"python -m qml_ray.train --config {cluster.IMAGE_HOME}/configs/qcnn-23q.yaml "
                                 "--workers 32 ")
    assert "--storage gs://my-project-qml-ray/runs" in entrypoint
    assert entrypoint.endswith("--name qcnn --resume")  # a retried job continues the run
    assert docs["qcnn-train"]["spec"]["backoffLimit"] >= 1
    assert docs["qcnn-cluster"]["spec"]["workerGroupSpecs"][0]["maxReplicas"] == 32
    assert docs["qcnn-tensorboard"]["kind"] in {"Deployment", "Service"}
    service = [d for d in docs.values() if d["kind"] == "Service"][0]
    assert service["spec"]["type"] == "ClusterIP"


def test_image_and_project_use_the_same_ray_and_python():
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{ray.__version__}-py311-cpu" in dockerfile
    assert f"WORKDIR {cluster.IMAGE_HOME}" in dockerfile and "COPY --chown=ray:users configs ./configs" in dockerfile
    assert f'"ray[train,data,default]=={ray.__version__}"' in (ROOT / "pyproject.toml").read_text()


def test_render_command_prints_or_writes_the_manifests(tmp_path):
    done = run_command("cluster", "render", "--config", "configs/qcnn-23q.yaml", "--workers", "32",
                       *[f"--{k}={v}" for k, v in DEFAULTS.items()])
    assert done.returncode == 0, done.stderr
    assert done.stdout == CHECKED_IN.read_text()
    out = tmp_path / "rendered"
    written = run_command("cluster", "render", "--config", "configs/qcnn-23q.yaml", "--workers", "32",
                          *[f"--{k}={v}" for k, v in DEFAULTS.items()], "--out", out)
    assert written.returncode == 0, written.stderr
    files = {p.name: list(yaml.safe_load_all(p.read_text())) for p in out.iterdir()}
    assert sorted(files) == ["qcnn-cluster.yaml", "qcnn-infer.yaml", "qcnn-tensorboard.yaml", "qcnn-train.yaml",
                             "qml-ray.yaml"]
    assert [d["kind"] for d in files["qcnn-tensorboard.yaml"]] == ["Deployment", "Service"]
    def key(doc):
        return doc["kind"], doc["metadata"]["name"]

    assert sorted(sum(files.values(), []), key=key) == sorted(yaml.safe_load_all(CHECKED_IN.read_text()), key=key)
    bad = run_command("cluster", "render", "--config", "configs/qcnn-23q.yaml", "--workers", "0",
                      *[f"--{k}={v}" for k, v in DEFAULTS.items()])
    assert bad.returncode == 2 and bad.stderr.strip() == "error: workers must be at least 1"
