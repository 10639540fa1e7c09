"""What makes the rendered manifests secure by default (docs/security.md).

Every pod meets Kubernetes' "restricted" Pod Security Standard: the image's non-root user,
no privilege escalation, no capabilities, the runtime's seccomp profile, and a read-only root
file system with an empty folder for each place that is written. No pod gets a Kubernetes API
token but the head's, and there only the Ray autoscaler's container sees it. Network policies
let only a Ray cluster's own pods reach its ports; images are pinned by digest.
"""

import re

UID, GID = 1000, 100  # the rayproject/ray images' user `ray` and its group `users`
INSTANCE = "app.kubernetes.io/instance"  # label of a Ray cluster's pods (and its job submitter): the resource's name
OPERATOR = {"app.kubernetes.io/name": "kuberay-operator"}  # the KubeRay operator's pod (its Helm chart's label)
DASHBOARD_PORT = 8265
# Where the pods write, each an empty folder of the pod's own: /tmp (Ray's sessions in /tmp/ray,
# temporary files), ~/.cache (libraries' caches), ~/.config (matplotlib's, imported by cirq).
WRITABLE = {"tmp": "/tmp", "cache": "/home/ray/.cache", "config": "/home/ray/.config"}
API_TOKEN = "kube-api-access"
API_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"  # where Kubernetes clients look for it
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": GID, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"  # a component of a repository name
# An image named by digest, so that every pod runs the same bytes: REPOSITORY[:TAG]@sha256:DIGEST.
PINNED_IMAGE = re.compile(rf"{_NAME}(?::\d+)?(?:/{_NAME})*(?::\w[\w.-]{{0,127}})?@sha256:[0-9a-f]{{64}}")


def _writable_mounts() -> list[dict]:
    return [{"name": name, "mountPath": path} for name, path in WRITABLE.items()]


def container(spec: dict) -> dict:
    """A container that cannot gain privileges and writes only to its pod's empty folders."""
    return {
        **spec,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [*spec.get("volumeMounts", []), *_writable_mounts()],
    }


def pod(spec: dict) -> dict:
    """A pod of restricted containers (see `container`) as the image's user, with no API token."""
    return {
        **spec,
        "automountServiceAccountToken": False,
        "securityContext": POD_SECURITY,
        "volumes": [*spec.get("volumes", []), *({"name": name, "emptyDir": {}} for name in WRITABLE)],
    }


def api_token_volume() -> dict:
    """The service account's API credentials as Kubernetes mounts them, for the one container that needs them."""
    return {
        "name": API_TOKEN,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]
        },
    }


def autoscaler_container() -> dict:
    """`autoscalerOptions` for the autoscaler container KubeRay adds to the head: restricted like the
    rest, and the only one with the API token (it scales the RayCluster through the Kubernetes API)."""
    return {
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [*_writable_mounts(), {"name": API_TOKEN, "mountPath": API_TOKEN_PATH, "readOnly": True}],
    }


def namespace(name: str) -> dict:
    """The namespace, where Kubernetes admits only pods that meet the restricted standard."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/warn": "restricted",
            },
        },
    }


def network_policy(name: str, pods: dict, *sources: dict) -> dict:
    """Ingress to the pods labelled `pods` only from the `sources` rules (none: only kubectl port-forward,
    which enters the pod from its node)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"], "ingress": list(sources)},
    }


def ray_network_policy(name: str, job: bool) -> dict:
    """A Ray cluster's pods (labelled `INSTANCE: name`) reach each other on every port; nothing else
    reaches them, but for a RayJob the KubeRay operator, which follows the job on the head's dashboard."""
    own = {INSTANCE: name}
    rules = [{"from": [{"podSelector": {"matchLabels": own}}]}]
    if job:
        rules.append(
            {
                "from": [{"podSelector": {"matchLabels": OPERATOR}}],
                "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}],
            }
        )
    return network_policy(name, own, *rules)
