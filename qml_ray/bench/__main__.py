"""`python -m qml_ray.bench`: the scaling benchmark.

runtimes  qml_ray (Ray Train), the tf-operator-style baseline (plain TF_CONFIG processes) and
          one undistributed process, interleaved: epoch times, throughput, parallel efficiency,
          start-up, the end after the last epoch and memory, as JSON, a Markdown table and a PNG plot
circuits  forward and forward + gradient seconds per circuit against qubits (the QCNN's, or with
          --family controlled multi-controlled gates'), the block kernel's
          memory traffic against a state-sized in-place pass's, and the 23-qubit headline projected
          from them, as JSON, Markdown and plots; with --peers, qsim and PennyLane Lightning too
classical the re-uploading example (classical features only): seconds per circuit, block against
          TFQ's Adjoint, and its training on 2 workers against plain Keras in one process
elastic   the time a lost worker node costs a run on a local multi-node Ray, elastic (--workers 1-2)
          against waiting for its replacement (--workers 2), and training undisturbed
serving   `python -m qml_ray.serve` on loopback under 1, 8 and 64 concurrent clients: requests/s and
          p50/p99 latency, against one plain Keras process answering one request at a time
"""

import argparse
import json
import os
import sys
from pathlib import Path

from qml_ray import cli, config as config_lib, storage
from qml_ray.bench import peers
from qml_ray.bench.runtimes import POOLS, RUNTIMES
from qml_ray.errors import UsageError
from qml_ray.memory import machine_cpus, machine_memory, state_bytes, worker_state_memory

MIN_SECONDS = 2.0  # bench circuits: each figure timed over at least this many seconds of calls


def number_list(minimum: int):
    """An argparse type: comma-separated whole numbers, each at least `minimum`."""

    def parse(text: str) -> list[int]:
        try:
            numbers = [int(item) for item in text.split(",")]
        except ValueError:
            numbers = []
        if not numbers or min(numbers) < minimum:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers of at least {minimum}, got {text!r}")
        return sorted(set(numbers))

    return parse


def choice_list(choices):
    """An argparse type: a comma-separated subset of `choices`, in the order given."""

    def parse(text: str) -> list[str]:
        chosen = list(dict.fromkeys(text.split(",")))
        if not set(chosen) <= set(choices):
            raise argparse.ArgumentTypeError(f"expected some of {','.join(choices)}, got {text!r}")
        return chosen

    return parse


def positive(kind):
    """An argparse type: a positive int or float."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{runtimes,circuits,classical,elastic,serving}"
    )
    add_runtimes_command(commands)
    add_circuits_command(commands)
    add_classical_command(commands)
    add_elastic_command(commands)
    add_serving_command(commands)
    return parser.parse_args(argv)


def add_runtimes_command(commands) -> None:
    """`bench runtimes` and its flags."""
    runtimes = commands.add_parser(
        "runtimes",
        help="qml_ray against the TF_CONFIG baseline and one process",
        description="Train --config with each runtime at each worker count, in interleaved rounds, and "
        "write <out>/runtimes.json, runtimes.md and runtimes.png. Each run starts its own processes (and "
        "qml_ray its own local Ray); runs checkpoint at the last epoch only and never profile.",
    )
    runtimes.add_argument("--config", metavar="YAML", help="config file (default: the built-in defaults)")
    runtimes.add_argument(
        "--workers", type=number_list(1), default=[1, 2], metavar="N,N", help="worker counts (default: 1,2)"
    )
    runtimes.add_argument("--epochs", type=positive(int), metavar="N", help="override the config's epochs (at least 2)")
    runtimes.add_argument(
        "--rounds",
        type=positive(int),
        default=1,
        metavar="N",
        help="times every case runs, interleaved (default: 1); medians are reported",
    )
    runtimes.add_argument(
        "--runtimes",
        type=choice_list(RUNTIMES),
        default=list(RUNTIMES),
        metavar="LIST",
        help=f"some of {','.join(RUNTIMES)} (default: all)",
    )
    runtimes.add_argument(
        "--thread-pools",
        type=choice_list(POOLS),
        metavar="LIST",
        help="sized (to each worker's CPUs), default (TensorFlow's), or both: sized,default "
        "(default: as the config's size_thread_pools says)",
    )
    runtimes.add_argument(
        "--run-timeout",
        type=positive(float),
        default=1800,
        metavar="SECONDS",
        help="stop a run that takes longer (default: 1800)",
    )
    runtimes.add_argument("--out", default="benchmarks/runtimes", metavar="DIR", help="(default: benchmarks/runtimes)")


def add_circuits_command(commands) -> None:
    """`bench circuits` and its flags."""
    circuits = commands.add_parser(
        "circuits",
        help="seconds per circuit against qubits, and the headline projected",
        description="Time the QCNN's (or --family's) forward and forward + gradient per circuit at each qubit "
        "count, in this process, and write <out>/circuits.json and circuits.md. With 23 among --qubits, project "
        "the headline run (23 qubits, 1000 examples, 512 vCPUs) from them.",
    )
    circuits.add_argument(
        "--qubits", type=number_list(4), default=[8, 12, 16, 20, 23], metavar="N,N", help="(default: 8,12,16,20,23)"
    )
    circuits.add_argument(
        "--circuits", type=positive(int), metavar="N", help="circuits per batch (default: 64, down to 2 at 23 qubits)"
    )
    circuits.add_argument(
        "--family",
        choices=["qcnn", "controlled"],
        default="qcnn",
        help="the circuits: the QCNN (default), or multi-controlled gates (ZZ with 2 controls, rx with 3) "
        "through a TFQ expectation layer",
    )
    circuits.add_argument(
        "--threads",
        type=positive(int),
        default=1,
        metavar="N",
        help="TensorFlow's and the block kernel's threads (default: 1, so the figures are per vCPU)",
    )
    circuits.add_argument(
        "--peers",
        action="store_true",
        help="also time qsim's forward and PennyLane Lightning's adjoint gradient on the same circuits, "
        f"checked against the block kernel's values (needs the peers extra: {peers.INSTALL})",
    )
    circuits.add_argument(
        "--efficiency-from",
        metavar="JSON",
        help="a runtimes.json: project at its qml_ray parallel efficiency with the most "
        "workers (default: efficiency 1, ideal)",
    )
    circuits.add_argument(
        "--min-seconds",
        type=positive(float),
        default=MIN_SECONDS,
        metavar="S",
        help=f"time each figure over at least this many seconds of calls (default: {MIN_SECONDS:g}; "
        "lower for a quick look)",
    )
    circuits.add_argument("--out", default="benchmarks/circuits", metavar="DIR", help="(default: benchmarks/circuits)")


def add_classical_command(commands) -> None:
    """`bench classical` and its flags."""
    classical = commands.add_parser(
        "classical",
        help="a model of classical features: block against TFQ per circuit, qml_ray against plain Keras",
        description="From the project's folder: time the re-uploading example (examples/reuploading.py) per "
        "circuit with the block gradient and TFQ's Adjoint at each qubit count, then train it with "
        "qml_ray (--workers workers) and with plain Keras and TFQ's Adjoint in this process, in rounds; "
        "write <out>/classical.json and classical.md.",
    )
    classical.add_argument(
        "--qubits", type=number_list(2), default=[4, 6, 8, 10, 12], metavar="N,N", help="(default: 4,6,8,10,12)"
    )
    classical.add_argument("--circuits", type=positive(int), default=32, metavar="N", help="circuits per batch (32)")
    classical.add_argument("--workers", type=positive(int), default=2, metavar="N", help="qml_ray's workers (2)")
    classical.add_argument("--epochs", type=positive(int), default=15, metavar="N", help="epochs of each training (15)")
    classical.add_argument("--rounds", type=positive(int), default=2, metavar="N", help="rounds of both trainings (2)")
    classical.add_argument(
        "--min-seconds", type=positive(float), default=MIN_SECONDS, metavar="S", help=f"(default: {MIN_SECONDS:g})"
    )
    classical.add_argument(
        "--out", default="benchmarks/classical", metavar="DIR", help="(default: benchmarks/classical)"
    )


def add_elastic_command(commands) -> None:
    """`bench elastic` and its flags."""
    elastic = commands.add_parser(
        "elastic",
        help="a lost node, elastic against waiting for its replacement",
        description="Start a local Ray of a head and two 1-CPU worker nodes (scripts/local_cluster.sh), train "
        "--config on it undisturbed, then fixed and elastic with a worker node lost after --lose-after epochs and "
        "replaced --delay seconds later, and write <out>/elastic.json and elastic.md.",
    )
    elastic.add_argument("--config", default="configs/tutorial.yaml", metavar="YAML", help="(default: the tutorial's)")
    elastic.add_argument("--epochs", type=positive(int), default=100, metavar="N", help="(default: 100)")
    elastic.add_argument("--checkpoint-every", type=positive(int), default=5, metavar="N", help="(default: 5)")
    elastic.add_argument("--lose-after", type=positive(int), default=12, metavar="N", help="epochs (default: 12)")
    elastic.add_argument(
        "--delay", type=positive(float), default=30, metavar="SECONDS", help="until the replacement (default: 30)"
    )
    elastic.add_argument("--out", default="benchmarks/elastic", metavar="DIR", help="(default: benchmarks/elastic)")


def add_serving_command(commands) -> None:
    """`bench serving` and its flags."""
    serving = commands.add_parser(
        "serving",
        help="qml_ray.serve under concurrent clients, against one plain Keras process",
        description="Serve --run with `python -m qml_ray.serve` (its own local Ray) and with one plain Keras "
        "process answering one request at a time, send each one-row requests from each count of concurrent "
        "clients on loopback, and write <out>/serving.json and serving.md.",
    )
    serving.add_argument("--run", required=True, help="a trained run folder of the built-in QCNN")
    serving.add_argument("--clients", type=number_list(1), default=[1, 8, 64], metavar="N,N", help="(default: 1,8,64)")
    serving.add_argument(
        "--requests", type=positive(int), default=256, metavar="N", help="the most requests per step (256)"
    )
    serving.add_argument(
        "--seconds", type=positive(float), default=60, metavar="S", help="the longest a step sends (60)"
    )
    serving.add_argument("--out", default="benchmarks/serving", metavar="DIR", help="(default: benchmarks/serving)")


def require_cpus(processes: int, threads: int, remedy: str) -> None:
    """A UsageError unless this machine, where every benchmark process runs, has the CPUs for them."""
    cpus = machine_cpus()
    if processes * threads > cpus:
        raise UsageError(
            f"{processes} process(es) of {threads} CPU(s) need more than this machine's {cpus:g}: {remedy}"
        )


def require_memory(processes: int, threads: int, qubits: int, remedy: str) -> None:
    """A UsageError unless this machine has the memory for the state vectors of `processes` processes
    simulating `qubits` qubits on `threads` threads each, each sized as a worker is (`memory.state_bytes` in
    its `memory.worker_state_memory`, of the machine's or its container's memory and CPUs): only a circuit too
    large to run even alone fails."""
    memory = machine_memory()
    each = worker_state_memory(memory, machine_cpus(), threads)
    need = processes * state_bytes(qubits, threads, each)
    if need > memory:
        raise UsageError(
            f"the state vectors of {qubits} qubits on {processes * threads} thread(s) need {need / 2**30:.3g} GiB, "
            f"more than this machine's {memory / 2**30:.3g} GiB: {remedy}"
        )


def write_outputs(out: str, stem: str, doc: dict, table: str) -> Path:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (folder / f"{stem}.md").write_text(table)
    print(table, flush=True)
    return folder


def runtimes_main(args) -> None:
    from qml_ray.bench import report, runtimes

    config = config_lib.load(args.config) if args.config else config_lib.Config()
    epochs = args.epochs or config.epochs
    if epochs < 2:
        raise UsageError("the benchmark needs at least 2 epochs: the first is reported apart")
    config = config.replace(epochs=epochs, checkpoint_every=epochs, profile_steps="", profiler_port=0)
    storage.check_local_folder(args.out)
    require_cpus(max(args.workers), config.cpus_per_worker, "lower --workers or the config's cpus_per_worker")
    require_memory(max(args.workers), config.cpus_per_worker, config.qubits, "lower --workers or the config's qubits")
    pools = args.thread_pools or ["sized" if config.size_thread_pools else "default"]
    measured = runtimes.run_all(config, args.runtimes, args.workers, pools, args.rounds, args.run_timeout)
    results, ratios = report.summarize(measured["records"], measured["train_examples"], measured["test_examples"])
    doc = {
        "config": {k: v for k, v in config_lib.asdict(config).items() if k not in ("storage", "workers")},
        "machine_cpus": os.cpu_count(),
        "rounds": args.rounds,
        "train_examples": measured["train_examples"],
        "test_examples": measured["test_examples"],
        "results": results,
        "ratios": ratios,
        "records": measured["records"],
    }
    folder = write_outputs(args.out, "runtimes", doc, report.markdown(doc))
    report.plot(doc, str(folder / "runtimes.png"))
    print(f"wrote {folder}/runtimes.json, runtimes.md and runtimes.png", flush=True)


def efficiency_from(path: str | None) -> tuple[float, str]:
    """qml_ray's parallel efficiency with the most workers in a runtimes.json, or 1 (ideal)."""
    if not path:
        return 1.0, "ideal: no measured efficiency given"
    try:
        doc = json.loads(Path(path).read_text())
        measured = [r for r in doc["results"] if r["runtime"] == "qml_ray" and r["parallel_efficiency"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"cannot read a runtimes.json from {path}: {err}") from None
    if not measured:
        raise UsageError(f"{path} has no qml_ray parallel efficiency (measure with the single runtime too)")
    best = max(measured, key=lambda r: (r["workers"], r["parallel_efficiency"]))
    return best["parallel_efficiency"], (
        f"measured: qml_ray, {best['workers']} workers, {doc['config']['qubits']} qubits, on {doc['machine_cpus']} CPUs"
    )


def circuits_main(args) -> None:
    efficiency, source = efficiency_from(args.efficiency_from)
    if max(args.qubits) > config_lib.MAX_QUBITS:
        raise UsageError(f"--qubits must be at most {config_lib.MAX_QUBITS}: no machine holds the state vectors")
    if args.peers and args.family != "qcnn":
        raise UsageError("--peers times the qcnn family only")
    if args.peers and peers.missing():
        raise UsageError(f"--peers needs {', '.join(peers.missing())}, not installed: {peers.INSTALL}")
    storage.check_local_folder(args.out)
    require_memory(1, args.threads, max(args.qubits), "lower --qubits or --threads")
    threads = str(args.threads)  # TensorFlow and Lightning's OpenMP read these once, when they start: before the import
    os.environ.update(
        {"TF_NUM_INTRAOP_THREADS": threads, "TF_NUM_INTEROP_THREADS": threads, "OMP_NUM_THREADS": threads}
    )
    from qml_ray import kernel
    from qml_ray.bench import circuits, figures, projection

    print(f"block kernel: the {kernel.PATH} path (this CPU has {kernel.cpu_features()})", flush=True)
    probes = []
    for qubits in args.qubits:
        count = args.circuits or circuits.default_circuits(qubits)
        print(f"timing {qubits} qubits, {count} circuits per batch ...", flush=True)
        probes.append(circuits.probe(qubits, count, args.threads, args.peers, args.family, args.min_seconds))
        probe = probes[-1]
        print(
            f"    forward: TFQ {probe['tfq_forward_seconds']:.4g}, block {probe['block_forward_seconds']:.4g} "
            f"s/circuit; forward + gradient: TFQ {probe['tfq_forward_gradient_seconds']:.4g}, "
            f"block {probe['block_forward_gradient_seconds']:.4g} s/circuit",
            flush=True,
        )
        if args.peers:
            print(f"    {peers.progress_line(probe['peers'])}", flush=True)
    headline = next((p for p in probes if p["qubits"] == projection.HEADLINE.qubits and args.family == "qcnn"), None)
    doc = {
        "machine_cpus": os.cpu_count(),
        "threads": args.threads,
        "min_seconds": args.min_seconds,  # each figure timed over at least this long
        "kernel_path": kernel.PATH,
        "family": args.family,
        "probes": probes,
        "projection": projection.project(headline, efficiency, source) if headline else None,
    }
    folder = write_outputs(args.out, "circuits", doc, circuits.markdown(doc))
    pictures = ", ".join(path.name for path in figures.draw(doc, folder))
    print(f"wrote {folder}/circuits.json, circuits.md and {pictures}", flush=True)
    disagreeing = peers.disagreements(probes)
    if disagreeing:  # a wrong simulator, not bad input: status 1, after the figures are written
        sys.exit(f"error: the peers' values differ from the block kernel's: {'; '.join(disagreeing)}")


def classical_main(args) -> None:
    from qml_ray.bench import classical

    if args.epochs < 2:
        raise UsageError("the benchmark needs at least 2 epochs: the first is reported apart")
    storage.check_local_folder(args.out)
    require_cpus(args.workers, 1, "lower --workers")
    config = config_lib.Config(workers=args.workers, epochs=args.epochs, batch_size=16, seed=0, test_fraction=0.3)
    print(f"timing {', '.join(map(str, args.qubits))} qubits, {args.circuits} circuits per batch ...", flush=True)
    costs = classical.cost_per_circuit(args.qubits, args.circuits, args.min_seconds)
    print(f"training on {args.workers} workers and in one process, {args.rounds} round(s) ...", flush=True)
    records = classical.training(Path(args.out), config, args.rounds, timeout=1800)
    doc = {"machine_cpus": os.cpu_count(), "threads": len(os.sched_getaffinity(0)), "costs": costs, "records": records}
    doc["config"] = {key: getattr(config, key) for key in ("workers", "epochs", "batch_size", "seed", "test_fraction")}
    folder = write_outputs(args.out, "classical", doc, classical.markdown(doc))
    print(f"wrote {folder}/classical.json and classical.md", flush=True)


def elastic_main(args) -> None:
    from qml_ray.bench import elastic

    if args.lose_after >= args.epochs:
        raise UsageError("--lose-after must be fewer than --epochs: the node is lost during training")
    config_lib.load(args.config)  # a bad config: one line, before any cluster starts
    storage.check_local_folder(args.out)
    print(f"training {args.config} on a local cluster: {', '.join(elastic.CASES)} ...", flush=True)
    doc = elastic.run(Path(args.out), args.config, args.epochs, args.lose_after, args.delay, args.checkpoint_every)
    doc["machine_cpus"] = os.cpu_count()
    folder = write_outputs(args.out, "elastic", doc, elastic.markdown(doc))
    print(f"wrote {folder}/elastic.json and elastic.md", flush=True)


def serving_main(args) -> None:
    import platform

    from qml_ray import config as config_lib
    from qml_ray.bench import serving

    config_lib.of_run(args.run)  # no run: one line, before any server starts
    storage.check_local_folder(args.out)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    records = serving.measure(args.run, args.clients, args.requests, args.seconds, folder)
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    doc = {"run": args.run, "requests": args.requests, "seconds": args.seconds, "cpu": cpu}
    doc |= {"machine_cpus": len(os.sched_getaffinity(0)), "records": records}
    write_outputs(args.out, "serving", doc, serving.markdown(doc))
    print(f"wrote {folder}/serving.json and serving.md", flush=True)
    lost = serving.unanswered(records)
    for server, count in lost.items():
        if server != "qml_ray":  # the baseline's losses are a figure, not the run's failure
            print(f"the {server} baseline left {count} request(s) unanswered", flush=True)
    if lost.get("qml_ray"):
        sys.exit(f"error: qml_ray left {lost['qml_ray']} request(s) unanswered")


def main(argv=None) -> None:
    args = parse_args(argv)
    commands = {"runtimes": runtimes_main, "circuits": circuits_main, "classical": classical_main}
    {**commands, "elastic": elastic_main, "serving": serving_main}[args.command](args)


if __name__ == "__main__":
    cli.run(main)
