#!/usr/bin/env bash
# A real multi-node Ray cluster on this machine, shaped like the RayCluster on GKE: a head
# that runs no work (num-cpus 0) and serves the dashboard, and worker nodes, each its own
# `ray start` in a session of its own. `down` stops exactly those nodes: each node's `ray start`
# by its PID, then whatever is left in its session after 5 s.
#
#   scripts/local_cluster.sh up [WORKER_NODES (2)] [CPUS_PER_NODE (1)]
#   scripts/local_cluster.sh add [CPUS (1)]     one more worker node (e.g. replacing a lost one)
#   scripts/local_cluster.sh down
#
# Environment: QML_RAY_CLUSTER_DIR (PIDs and logs; /tmp/qml-ray-cluster), RAY_PORT (6380),
# DASHBOARD_PORT (8265), DASHBOARD_AGENT_PORT (the head's agent, which runs the jobs; 52365). The cluster uses Ray's token authentication: clients need
# RAY_AUTH_MODE=token too (the token is in ~/.ray/auth_token), e.g.
#   RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 ...
set -euo pipefail
export RAY_AUTH_MODE=token
# Keep idle worker processes a minute (Ray: 1 s beyond one per CPU), so Ray Data's 0-CPU tasks do
# not start new processes every epoch on nodes whose CPUs the training holds (qml_ray/runtime.py).
export RAY_idle_worker_killing_time_threshold_ms=${RAY_idle_worker_killing_time_threshold_ms:-60000}
dir=${QML_RAY_CLUSTER_DIR:-/tmp/qml-ray-cluster}
port=${RAY_PORT:-6380}
dashboard=${DASHBOARD_PORT:-8265}
agent=${DASHBOARD_AGENT_PORT:-52365}
# The nodes' processes ask this cluster's dashboard of its state (Ray Train's placement group cleaner does),
# not the cluster /tmp/ray/ray_current_cluster names: another `ray start --head` may have written it since.
export RAY_API_SERVER_ADDRESS=http://127.0.0.1:$dashboard

start_node() {  # log name, then `ray start` arguments: the node is a session of its own, led by its PID
  local log=$1; shift
  setsid ray start --block --disable-usage-stats "$@" > "$dir/$log.log" 2>&1 &
  echo $! >> "$dir/pids"
}

node_temp_dir() {  # a worker node's own temporary folder (short: Ray's socket paths must fit 107 bytes)
  # As on separate machines: nodes sharing /tmp/ray share the jobs' unpacked working folders, and a
  # worker node unpacking one again deletes it under the driver that runs in it on the head.
  local temp
  temp=$(mktemp -d /tmp/qml-ray-node-XXXXXX)
  echo "$temp" >> "$dir/temp_dirs"
  echo "$temp"
}

registered_nodes() {  # every node that joined, alive or not (a lost node stays listed as dead)
  # Asked of the dashboard's state API, with Ray's token: a client joining Ray (ray.init) would add a
  # job per poll, and a `ray list nodes` process takes 1.5 s of CPU from the nodes starting meanwhile.
  python - "$dashboard" 2>/dev/null << 'EOF' || echo 0
import json, pathlib, sys, urllib.request
token = (pathlib.Path.home() / ".ray" / "auth_token").read_text().strip()
url = f"http://127.0.0.1:{sys.argv[1]}/api/v0/nodes?limit=10000"
with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}), timeout=10) as answer:
    print(len(json.load(answer)["data"]["result"]["result"]))
EOF
}

wait_for_nodes() {  # count: wait until that many nodes have joined, up to 120 s
  for _ in $(seq 240); do
    [ "$(registered_nodes)" -ge "$1" ] && return 0
    sleep 0.5
  done
  echo "error: the cluster did not reach $1 node(s) within 120 s; logs in $dir" >&2
  down
  exit 1
}

up() {
  local nodes=${1:-2} cpus=${2:-1}
  mkdir -p "$dir"
  if [ -s "$dir/pids" ]; then echo "error: a cluster is already up ($dir/pids): run down first" >&2; exit 2; fi
  ray get-auth-token --generate > /dev/null
  start_node head --head --port "$port" --num-cpus 0 --include-dashboard true \
    --dashboard-host 127.0.0.1 --dashboard-port "$dashboard" --dashboard-agent-listen-port "$agent"
  wait_for_nodes 1
  for i in $(seq "$nodes"); do  # one at a time: nodes racing to register can time out
    start_node "worker-$i" --address "127.0.0.1:$port" --num-cpus "$cpus" --temp-dir "$(node_temp_dir)"
    wait_for_nodes $((i + 1))
  done
  echo "Ray cluster up: $((nodes + 1)) nodes, dashboard http://127.0.0.1:$dashboard, address 127.0.0.1:$port"
}

add() {
  local cpus=${1:-1}
  if [ ! -s "$dir/pids" ]; then echo "error: no cluster is up: run up first" >&2; exit 2; fi
  local joined
  joined=$(registered_nodes)
  start_node "worker-$(wc -l < "$dir/pids")" --address "127.0.0.1:$port" --num-cpus "$cpus" --temp-dir "$(node_temp_dir)"
  wait_for_nodes $((joined + 1))
  echo "worker node added"
}

in_sessions() {  # node PIDs: whether any process of their sessions still runs (zombies do not count)
  local pid
  for pid in "$@"; do
    ps -o stat= -s "$pid" 2>/dev/null | grep -qv '^Z' && return 0
  done
  return 1
}

wait_for_sessions() {  # seconds, then node PIDs: wait up to that long until nothing of their sessions runs
  for _ in $(seq $(($1 * 2))); do
    in_sessions "${@:2}" || return 0
    sleep 0.5
  done
}

live_nodes() {  # the recorded nodes still running: a node lost meanwhile left its PID, which another process may have now
  local pid
  for pid in $(cat "$dir/pids"); do
    ps -o sid=,args= -p "$pid" 2> /dev/null | grep -qE "^ *$pid .*ray start" && echo "$pid"
  done
  return 0
}

down() {  # each node stops itself (SIGTERM); what is left of a node after 5 s is killed
  [ -s "$dir/pids" ] || return 0
  local pids pid
  pids=$(live_nodes)
  kill $pids 2>/dev/null || true
  wait_for_sessions 5 $pids
  # The head waits about 30 s for actors a job left behind (Ray Train's and Ray Data's detached ones).
  for pid in $pids; do pkill -KILL -s "$pid" 2>/dev/null || true; done
  wait_for_sessions 10 $pids
  rm -f "$dir/pids"
  if [ -s "$dir/temp_dirs" ]; then xargs rm -rf < "$dir/temp_dirs"; rm -f "$dir/temp_dirs"; fi
  # `ray start --head` recorded this cluster as the machine's current one: forget it.
  if grep -qs ":${port}\$" /tmp/ray/ray_current_cluster; then rm -f /tmp/ray/ray_current_cluster; fi
  echo "Ray cluster down"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  add) shift; add "$@" ;;
  down) down ;;
  *) echo "usage: $0 up [WORKER_NODES] [CPUS_PER_NODE] | add [CPUS] | down" >&2; exit 2 ;;
esac
