#!/usr/bin/env bash
# Submit a qml_ray command to the RayCluster on GKE with `ray job submit`, through a
# port-forward to its dashboard (also open in a browser at http://127.0.0.1:8265 meanwhile),
# with Ray's token from the Secret KubeRay made for the cluster.
#
#   scripts/submit.sh python -m qml_ray.train --config configs/qcnn-23q.yaml --workers 47 \
#       --storage gs://BUCKET/runs --name qcnn
#
# Environment: RAY_CLUSTER (the RayCluster's name; qcnn-cluster), NAMESPACE (qml-ray),
# DASHBOARD_PORT (8265).
set -euo pipefail
cluster=${RAY_CLUSTER:-qcnn-cluster}
namespace=${NAMESPACE:-qml-ray}
port=${DASHBOARD_PORT:-8265}
[ $# -gt 0 ] || { echo "usage: $0 COMMAND..." >&2; exit 2; }

export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(kubectl -n "$namespace" get secret "$cluster" -o jsonpath='{.data.auth_token}' | base64 -d)
export RAY_AUTH_TOKEN
kubectl -n "$namespace" port-forward "service/${cluster}-head-svc" "${port}:8265" > /dev/null &
forward=$!
trap 'kill $forward' EXIT
for _ in $(seq 30); do
  curl -fs "http://127.0.0.1:${port}/api/gcs_healthz" > /dev/null && break
  sleep 1
done
ray job submit --address "http://127.0.0.1:${port}" --working-dir . -- "$@"
