"""`bench elastic`: what a lost node costs a training run, elastic against waiting for its replacement.

On a local multi-node Ray (scripts/local_cluster.sh: a head and two worker nodes of one CPU), the same
training runs three times: undisturbed, then with a worker node lost mid-run twice, fixed (`--workers 2`,
waiting for the replacement) and elastic (`--workers 1-2`). The replacement node joins `delay` seconds
after the loss, standing for GKE's time to bring a new spot node. A lost node is every process of its
`ray start` session killed at once; the GCS declares it dead after 3 health checks 1 s apart.
"""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

CASES = {"undisturbed": "2", "fixed": "2", "elastic": "1-2"}  # --workers of each
# A first, short run, not reported: a cluster's first job starts Ray Train's and Ray Data's detached actors
# and the nodes' first worker processes, which took 100 s more here.
WARM_UP = ("--epochs", "1")
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local_cluster.sh"
RESTORED = re.compile(r"^continuing from the checkpoint of epoch \d+$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalCluster:
    """The local multi-node Ray the runs train on, its state in `folder`."""

    def __init__(self, folder: Path):
        self.port = free_port()
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # its `ray` and `python`
            "QML_RAY_CLUSTER_DIR": str(folder),
            "RAY_PORT": str(self.port),
            "DASHBOARD_PORT": str(free_port()),
            "RAY_AUTH_MODE": "token",
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
        }
        self.pids = folder / "pids"

    def script(self, *args: str) -> None:
        subprocess.run([SCRIPT, *args], env=self.env, check=True, capture_output=True, timeout=300)

    def lose_newest_node(self) -> None:
        """Kill every process of the newest worker node's session at once, as a reclaimed VM is lost."""
        leader = int(self.pids.read_text().split()[-1])
        while members := session_processes(leader):
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)


def session_processes(session: int) -> list[int]:
    """The PIDs of the processes of session `session`."""
    found = []
    for pid in (name for name in os.listdir("/proc") if name.isdigit()):  # a gone process's files raise ESRCH
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:
                found.append(int(pid))
    return found


def epochs_done(run: Path) -> int:
    """The last epoch in the run's metrics.csv (0 before it is written)."""
    with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
        return int((run / "metrics.csv").read_text().splitlines()[-1].split(",")[0])
    return 0


def train(cluster: LocalCluster, case: str, options: tuple, storage: Path, lose_after: int, delay: float) -> dict:
    """One run of `case` (of CASES, or the warm-up: undisturbed); fixed or elastic, its node is lost after
    `lose_after` epochs and replaced `delay` seconds later. Its seconds, and its console lines with their
    times since the start."""
    workers = CASES.get(case, CASES["undisturbed"])
    command = [sys.executable, "-m", "qml_ray.train", *options, "--workers", workers, "--storage", str(storage)]
    command += ["--name", case, "--address", f"127.0.0.1:{cluster.port}"]
    started, lines = time.monotonic(), []
    process = subprocess.Popen(command, env=cluster.env, stdout=subprocess.PIPE, text=True)

    def read():
        lines.extend((time.monotonic() - started, text.rstrip()) for text in process.stdout)

    reader = threading.Thread(target=read)
    reader.start()
    record, replacement = {"case": case}, None
    if case in ("fixed", "elastic"):
        while epochs_done(storage / case) < lose_after and process.poll() is None:
            time.sleep(0.1)
        cluster.lose_newest_node()
        record["lost_at"] = time.monotonic() - started

        def replace():
            cluster.script("add", "1")
            record["replaced_at"] = time.monotonic() - started

        replacement = threading.Timer(delay, replace)
        replacement.start()
    status = process.wait()
    record["seconds"] = time.monotonic() - started
    reader.join()
    if replacement:
        replacement.join()  # the next run starts on two worker nodes
    if status != 0:
        sys.exit(f"error: the {case} run failed; its lines: {[line for _, line in lines[-5:]]}")
    return {**record, "lines": lines}


def timeline(record: dict, epochs: int) -> dict:
    """From a run's lines: when training went on after the loss (a group restored from a checkpoint), when
    it grew back (elastic) and went on, and the epochs trained twice."""
    restored = [at for at, line in record["lines"] if RESTORED.match(line)]
    said = {line: at for at, line in record["lines"]}
    row = {"epochs_trained_twice": sum(bool(re.match(r"^epoch \d+/", line)) for _, line in record["lines"]) - epochs}
    if "lost_at" in record:
        row["training_again_after_loss"] = min(at for at in restored if at > record["lost_at"]) - record["lost_at"]
    if back := said.get("back to 2 workers"):
        row["training_again_after_replacement"] = min(at for at in restored if at > back) - record["replaced_at"]
    return row


def run(out: Path, config: str, epochs: int, lose_after: int, delay: float, checkpoint_every: int) -> dict:
    """Every case in turn on one local cluster (started here, stopped after)."""
    options = ("--config", config, "--epochs", str(epochs), "--checkpoint-every", str(checkpoint_every))
    options += ("--capacity-timeout", str(int(delay) + 300))  # the fixed run waits for its replacement
    cluster = LocalCluster(out / "cluster")
    cluster.script("up", "2", "1")
    try:
        train(cluster, "warm-up", (*options, *WARM_UP), out / "runs", lose_after, delay)
        records = []
        for case in CASES:
            print(f"  {case} ...", flush=True)
            record = train(cluster, case, options, out / "runs", lose_after, delay)
            records.append({**record, **timeline(record, epochs)})  # its console lines too, with their times
    finally:
        cluster.script("down")
    undisturbed = records[0]["seconds"]
    for record in records:
        record["seconds_lost"] = record["seconds"] - undisturbed
    return {"config": config, "epochs": epochs, "lose_after": lose_after, "delay": delay, "records": records}


def markdown(doc: dict) -> str:
    """The cases side by side, and what a lost node would cost the headline run on GKE."""
    rows = [
        f"| {r['case']} | {r['seconds']:.1f} | {r['seconds_lost']:+.1f} | {_shown(r.get('training_again_after_loss'))} "
        f"| {_shown(r.get('training_again_after_replacement'))} | {r['epochs_trained_twice']} |"
        for r in doc["records"]
    ]
    elastic = next(r for r in doc["records"] if r["case"] == "elastic")
    restart = elastic["training_again_after_loss"]
    return "\n".join(
        [
            f"{doc['config']}, {doc['epochs']} epochs, a worker node lost after epoch {doc['lose_after']} and replaced "
            f"{doc['delay']:.0f} s later:",
            "",
            "| run | seconds | lost | training again after the loss (s) | after the replacement (s) "
            "| epochs trained twice |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            "The headline on GKE (47 workers, a spot node replaced in about 3 minutes with its image pull): a fixed "
            f"run loses the replacement's minutes and a restart; an elastic one two restarts of about {restart:.0f} s "
            "here (one on the 46 workers left, one back on 47), and trains on 46 meanwhile.",
            "",
        ]
    )


def _shown(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f}"
