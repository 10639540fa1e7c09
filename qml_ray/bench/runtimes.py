"""The runtime comparison: qml_ray, the TF_CONFIG baseline and one undistributed process.

Each measurement is one command, run as a user runs it, with the config's `callbacks` naming the
benchmark's timings (bench/timings.py): every rank writes when its first training step began, its
epoch times and its peak memory to the run folder. Rounds are
interleaved (and every other round reversed) so that drift of the machine hits all alike.
"""

import csv
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from qml_ray import config as config_lib, storage

RUNTIMES = ("qml_ray", "baseline", "single")
TIMINGS = "qml_ray.bench.timings:per_rank"  # the runs' `callbacks`
TIMINGS_FOLDER = "timings"  # in each run folder: each rank's timings, rank-N.json
POOLS = {"sized": True, "default": False}  # thread pools: sized to the worker's CPUs, or TF's defaults
COMMANDS = {  # each runtime's command, given --config, --workers, --storage and --name
    "qml_ray": ["qml_ray.train", "--address", "local"],
    "baseline": ["qml_ray.bench.baseline"],
    "single": ["qml_ray.bench.baseline", "--no-distribution"],
}


@dataclass(frozen=True)
class Case:
    runtime: str
    workers: int
    pools: str

    def __str__(self):
        return f"{self.runtime}, {self.workers} worker(s), {self.pools} thread pools"


def plan(runtimes: list[str], workers: list[int], pools: list[str], rounds: int) -> list[tuple[int, Case]]:
    """(round, case) in the order to run them: every round holds every case once; odd rounds
    run in reverse. The single process runs with one worker only."""
    cases = [
        Case(runtime, n, pool)
        for n in workers
        for pool in pools
        for runtime in runtimes
        if runtime != "single" or n == 1
    ]
    if "single" in runtimes and 1 not in workers:
        cases = [Case("single", 1, pool) for pool in pools] + cases
    return [(r, case) for r in range(rounds) for case in (cases if r % 2 == 0 else cases[::-1])]


def bench_configs(config: config_lib.Config, pools: list[str], folder: Path) -> dict[str, Path]:
    """Per thread-pool choice, the config file its runs use, keeping their run folders under `folder`
    and their ranks' timings in them."""
    paths = {}
    for pool in pools:
        variant = config.replace(size_thread_pools=POOLS[pool], storage=str(folder / "runs"), callbacks=TIMINGS)
        paths[pool] = folder / f"config-{pool}.yaml"
        paths[pool].write_text(variant.to_yaml())
    return paths


def measure(case: Case, config_path: Path, folder: Path, name: str, timeout: float) -> dict:
    """Run one case's command; return its record (per epoch the slowest rank's seconds)."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}  # a local Ray of its own
    env["PYTHONUNBUFFERED"] = "1"
    command = [
        sys.executable,
        "-m",
        *COMMANDS[case.runtime],
        "--config",
        str(config_path),
        "--workers",
        str(case.workers),
        "--name",
        name,
    ]
    log = folder / f"{name}.log"
    launched = time.time()
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)  # the command's own process group
            process.wait()
            code = f"none: stopped after {timeout:.0f} s"
    ended = time.time()
    timings = folder / "runs" / name / TIMINGS_FOLDER
    ranks = [json.loads(path.read_text()) for path in sorted(timings.glob("rank-*.json"))]
    if code != 0 or len(ranks) != case.workers:
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
        raise SystemExit(
            f"error: {case} failed (exit status {code}, {len(ranks)} rank timings); the end of its output:\n{tail}"
        )
    return {
        "runtime": case.runtime,
        "workers": case.workers,
        "thread_pools": case.pools,
        "epoch_seconds": [max(epochs) for epochs in zip(*(rank["epoch_seconds"] for rank in ranks))],
        "startup_seconds": max(rank["first_step_at"] for rank in ranks) - launched,
        "peak_memory_mb": max(rank["peak_memory_mb"] for rank in ranks),
        "end_seconds": ended - last_epoch_at(str(folder / "runs" / name)),
        "wall_seconds": ended - launched,
        "rank_timings": ranks,  # each rank's epochs split into steps, validation and end-of-epoch work
    }


def last_epoch_at(run: str) -> float:
    """When the run's last epoch ended (Unix time, its metrics.csv row's): its epoch line's moment."""
    *_, last = csv.DictReader(io.StringIO(storage.read_text(storage.join(run, storage.HISTORY))))
    return float(last["finished_at"])


def split_sizes(folder: Path, name: str) -> tuple[int, int]:
    """Training and validation examples of a finished run under `folder`."""
    run = str(folder / "runs" / name)
    return tuple(pq.read_metadata(storage.split_path(run, split)).num_rows for split in ("train", "validation"))


def run_all(
    config: config_lib.Config, runtimes: list[str], workers: list[int], pools: list[str], rounds: int, timeout: float
) -> dict:
    """Measure every case `rounds` times, interleaved; return the raw records and the split sizes."""
    steps = plan(runtimes, workers, pools, rounds)
    records = []
    with tempfile.TemporaryDirectory(prefix="qml-bench-") as tmp:
        folder = Path(tmp)
        configs = bench_configs(config, pools, folder)
        for index, (round_, case) in enumerate(steps, 1):
            name = f"{index:03d}-{case.runtime}-{case.workers}-{case.pools}"
            print(f"[{index}/{len(steps)}] round {round_ + 1}: {case} ...", flush=True)
            record = measure(case, configs[case.pools], folder, name, timeout)
            records.append({**record, "round": round_ + 1})
            epochs = record["epoch_seconds"]
            print(
                f"    first epoch {epochs[0]:.2f} s, then {statistics.median(epochs[1:]):.2f} s/epoch "
                f"(median); start-up {record['startup_seconds']:.1f} s; ended {record['end_seconds']:.1f} s "
                "after its last epoch",
                flush=True,
            )
        train_examples, test_examples = split_sizes(folder, name)
    return {"records": records, "train_examples": train_examples, "test_examples": test_examples}
