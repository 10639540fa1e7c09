#!/usr/bin/env bash
# qml_ray on GKE: the cluster, its node pools, the bucket, the identities, the image, the
# namespace (restricted pods only) and the KubeRay operator in it.
#
#   scripts/gke.sh up     # create everything (about 15 minutes), then render the manifests
#   scripts/gke.sh down   # delete the cluster, the image repository and the service account
#                         # (the bucket, holding the runs, is kept: delete it by hand)
#
# Needs gcloud (logged in), kubectl, helm and docker. Every setting is here, at the top;
# each can be given in the environment instead.
set -euo pipefail

PROJECT=${PROJECT:-my-project}                  # Google Cloud project id
REGION=${REGION:-us-central1}                   # region of the bucket and the image repository
ZONE=${ZONE:-us-central1-a}                     # zone of the GKE cluster
CLUSTER=${CLUSTER:-qml-ray}                     # GKE cluster name
BUCKET=${BUCKET:-${PROJECT}-qml-ray}            # Cloud Storage bucket for the runs
REPOSITORY=${REPOSITORY:-qml-ray}               # Artifact Registry repository for the image
IMAGE=${IMAGE:-${REGION}-docker.pkg.dev/${PROJECT}/${REPOSITORY}/qml-ray:0.1.0}
IMAGE_PYTHON=${IMAGE_PYTHON:-py311}             # the image's Python (cluster/Dockerfile): py311 or py312
HEAD_MACHINE=${HEAD_MACHINE:-e2-standard-8}     # on-demand node for the Ray head and TensorBoard
WORKER_MACHINE=${WORKER_MACHINE:-c2-standard-16}  # spot nodes, one Ray worker pod (15 CPUs, 45Gi) each
MAX_WORKER_NODES=${MAX_WORKER_NODES:-47}        # upper bound of the spot pool's autoscaling
CONFIG=${CONFIG:-configs/qcnn-23q.yaml}         # the run's config: it sizes the worker pods
WORKERS=${WORKERS:-47}                          # training workers (one per worker pod)
NAME=${NAME:-qcnn}                              # run name and prefix of the Kubernetes resources
SERVICE_ACCOUNT=qml-ray                         # both the Google and the Kubernetes service account
NAMESPACE=${NAMESPACE:-qml-ray}                 # the namespace of the operator and of every resource
KUBERAY_VERSION=1.7.0
RENDERED=${RENDERED:-cluster/rendered}             # where the manifests for this setup are written

GSA="${SERVICE_ACCOUNT}@${PROJECT}.iam.gserviceaccount.com"

up() {
  gcloud config set project "$PROJECT"
  gcloud services enable container.googleapis.com artifactregistry.googleapis.com storage.googleapis.com

  # The cluster with Workload Identity and Dataplane V2 (which enforces network policies); a
  # small default pool for system pods, an on-demand pool for the Ray head, and an autoscaling
  # spot pool (tainted) for the Ray workers.
  gcloud container clusters create "$CLUSTER" --zone "$ZONE" --workload-pool "${PROJECT}.svc.id.goog" \
    --enable-dataplane-v2 --machine-type e2-standard-2 --num-nodes 1
  gcloud container node-pools create ray-head --cluster "$CLUSTER" --zone "$ZONE" \
    --machine-type "$HEAD_MACHINE" --num-nodes 1 --workload-metadata GKE_METADATA
  gcloud container node-pools create ray-workers --cluster "$CLUSTER" --zone "$ZONE" --spot \
    --machine-type "$WORKER_MACHINE" --num-nodes 0 --enable-autoscaling --min-nodes 0 \
    --max-nodes "$MAX_WORKER_NODES" --workload-metadata GKE_METADATA \
    --node-taints cloud.google.com/gke-spot=true:NoSchedule
  gcloud container clusters get-credentials "$CLUSTER" --zone "$ZONE"

  # The bucket, and a Google service account that may read and write its objects, nothing
  # more, which the Kubernetes service account of the pods acts as (Workload Identity).
  gcloud storage buckets create "gs://${BUCKET}" --location "$REGION" --uniform-bucket-level-access
  gcloud iam service-accounts create "$SERVICE_ACCOUNT" --display-name "qml_ray pods"
  gcloud storage buckets add-iam-policy-binding "gs://${BUCKET}" \
    --member "serviceAccount:${GSA}" --role roles/storage.objectUser
  gcloud iam service-accounts add-iam-policy-binding "$GSA" --role roles/iam.workloadIdentityUser \
    --member "serviceAccount:${PROJECT}.svc.id.goog[${NAMESPACE}/${SERVICE_ACCOUNT}]"

  # The image, and the digest it was pushed as: the manifests name the image by it.
  gcloud artifacts repositories create "$REPOSITORY" --repository-format docker --location "$REGION"
  gcloud auth configure-docker "${REGION}-docker.pkg.dev" --quiet
  docker build -f cluster/Dockerfile --build-arg PYTHON="$IMAGE_PYTHON" -t "$IMAGE" .
  docker push "$IMAGE"
  local digest
  digest=$(gcloud artifacts docker images describe "$IMAGE" --format 'value(image_summary.digest)')

  # The manifests for this project, bucket and image, one file per resource. The namespace
  # (where Kubernetes admits restricted pods only) and the pods' Kubernetes service account
  # (acting as the Google one) go in now, and the namespace becomes kubectl's default.
  python -m qml_ray.cluster render --config "$CONFIG" --workers "$WORKERS" --image "${IMAGE}@${digest}" \
    --bucket "$BUCKET" --project "$PROJECT" --namespace "$NAMESPACE" --name "$NAME" --out "$RENDERED"
  kubectl apply -f "$RENDERED/${NAMESPACE}.yaml"
  kubectl apply -f "$RENDERED/${SERVICE_ACCOUNT}.yaml"
  kubectl config set-context --current --namespace "$NAMESPACE"

  # The KubeRay operator, in the same namespace, with rights in that namespace only.
  helm repo add kuberay https://ray-project.github.io/kuberay-helm/
  helm repo update kuberay
  helm install kuberay-operator kuberay/kuberay-operator --version "$KUBERAY_VERSION" \
    --namespace "$NAMESPACE" --set singleNamespaceInstall=true --wait
  echo "ready: manifests in $RENDERED/ (see docs/gke.md)"
}

down() {
  gcloud container clusters delete "$CLUSTER" --zone "$ZONE" --quiet || true
  gcloud artifacts repositories delete "$REPOSITORY" --location "$REGION" --quiet || true
  gcloud iam service-accounts delete "$GSA" --quiet || true
  echo "deleted; the runs stay in gs://${BUCKET} (gcloud storage rm -r gs://${BUCKET} to delete them)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
