"""The runtime comparison's results: per case, the ratios, Markdown tables and the plot.

Steady-state epoch seconds: the median of epochs 2.. of a run (each epoch timed on its slowest
rank: training is synchronous), then the median over rounds; the first epoch (graph tracing,
first collectives) is reported apart. Parallel efficiency: T_single / (workers x T_workers),
for the same examples per epoch. End: the seconds from the last epoch's end (its epoch line) to
the command's exit.
"""

import statistics

from qml_ray.bench.runtimes import POOLS, RUNTIMES

COLORS = {"qml_ray": "tab:blue", "baseline": "tab:orange", "single": "grey"}
RESULT_FIELDS = (
    "first_epoch_seconds",
    "steady_epoch_seconds",
    "examples_per_second",
    "circuits_per_second",
    "parallel_efficiency",
    "startup_seconds",
    "end_seconds",
    "peak_memory_mb_per_worker",
)


def summarize(records: list[dict], train_examples: int, test_examples: int) -> tuple[list[dict], list[dict]]:
    """Results per (runtime, workers, thread pools), and the qml_ray / baseline ratios."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["runtime"], record["workers"], record["thread_pools"]), []).append(record)
    steady = {
        key: statistics.median(statistics.median(r["epoch_seconds"][1:]) for r in runs) for key, runs in groups.items()
    }
    results = []
    for key in sorted(groups, key=lambda k: (RUNTIMES.index(k[0]), k[2], k[1])):
        (runtime, workers, pools), runs, seconds = key, groups[key], steady[key]
        single = steady.get(("single", 1, pools))
        results.append(
            {
                "runtime": runtime,
                "workers": workers,
                "thread_pools": pools,
                "rounds": len(runs),
                "first_epoch_seconds": statistics.median(r["epoch_seconds"][0] for r in runs),
                "steady_epoch_seconds": seconds,
                "examples_per_second": train_examples / seconds,  # training examples: forward + gradient
                "circuits_per_second": (train_examples + test_examples) / seconds,  # and validation: forward
                "parallel_efficiency": single / (workers * seconds) if single else None,
                "startup_seconds": statistics.median(r["startup_seconds"] for r in runs),
                "end_seconds": statistics.median(r["end_seconds"] for r in runs),
                "peak_memory_mb_per_worker": max(r["peak_memory_mb"] for r in runs),
            }
        )
    ratios = []
    for result in results:
        if result["runtime"] == "qml_ray":
            key = ("baseline", result["workers"], result["thread_pools"])
            baseline = next((r for r in results if (r["runtime"], r["workers"], r["thread_pools"]) == key), None)
            if baseline:
                ratios.append(
                    {
                        "workers": result["workers"],
                        "thread_pools": result["thread_pools"],
                        "epoch_seconds": result["steady_epoch_seconds"] / baseline["steady_epoch_seconds"],
                        "startup_seconds": result["startup_seconds"] / baseline["startup_seconds"],
                    }
                )
    return results, ratios


def markdown(doc: dict) -> str:
    """The results and ratios as Markdown tables, under a line saying what was measured."""
    config = doc["config"]
    lines = [
        f"{config['qubits']} qubits, {config['layers']} layer(s), {doc['train_examples']} training + "
        f"{doc['test_examples']} validation examples, {config['epochs']} epochs, batch {config['batch_size']} "
        f"per worker, {config['cpus_per_worker']} CPU(s) per worker; {doc['rounds']} interleaved round(s) "
        f"on {doc['machine_cpus']} CPUs.",
        "",
        "| runtime | thread pools | workers | first epoch (s) | steady epoch (s) | examples/s | circuits/s "
        "| parallel efficiency | start-up (s) | end (s) | peak memory per worker (MB) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["results"]:
        efficiency = "-" if r["parallel_efficiency"] is None else f"{r['parallel_efficiency']:.2f}"
        lines.append(
            f"| {r['runtime']} | {r['thread_pools']} | {r['workers']} | {r['first_epoch_seconds']:.2f} "
            f"| {r['steady_epoch_seconds']:.3f} | {r['examples_per_second']:.1f} | {r['circuits_per_second']:.1f} "
            f"| {efficiency} | {r['startup_seconds']:.1f} | {r['end_seconds']:.1f} "
            f"| {r['peak_memory_mb_per_worker']:.0f} |"
        )
    if doc["ratios"]:
        lines += [
            "",
            "| workers | thread pools | qml_ray / baseline: steady epoch | qml_ray / baseline: start-up |",
            "| ---: | --- | ---: | ---: |",
        ]
        lines += [
            f"| {r['workers']} | {r['thread_pools']} | {r['epoch_seconds']:.3f} | {r['startup_seconds']:.2f} |"
            for r in doc["ratios"]
        ]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: str) -> None:
    """Steady epoch seconds and parallel efficiency against workers, every runtime, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = doc["results"]
    variants = sorted({r["thread_pools"] for r in results}, key=list(POOLS).index)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    most = max(r["workers"] for r in results)
    for pools, look in zip(variants, [("o", "-", "full"), ("s", "--", "none")]):
        suffix = f" ({pools} pools)" if len(variants) > 1 else ""
        chosen = [r for r in results if r["thread_pools"] == pools]
        _plot_single(axes, chosen, most, look, suffix)
        _plot_runtimes(axes, chosen, look, suffix)
    _label(axes, doc, most)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_single(axes, results: list[dict], most: int, look: tuple, suffix: str) -> None:
    """The single process's epoch, the ideal line it gives (single / workers), and its efficiency of 1."""
    times, efficiency = axes
    (marker, line, fill), color = look, COLORS["single"]
    single = next((r for r in results if r["runtime"] == "single"), None)
    if single:
        times.axhline(single["steady_epoch_seconds"], linestyle=line, color=color, label=f"single{suffix}")
        workers = range(1, most + 1)
        ideal = [single["steady_epoch_seconds"] / n for n in workers]
        times.plot(workers, ideal, ":", color=color, label=f"ideal: single / workers{suffix}")
        efficiency.plot([1], [1.0], marker, fillstyle=fill, color=color, label=f"single{suffix}")


def _plot_runtimes(axes, results: list[dict], look: tuple, suffix: str) -> None:
    """qml_ray's and the baseline's epoch and parallel efficiency against workers."""
    times, efficiency = axes
    marker, line, fill = look
    for runtime in ("qml_ray", "baseline"):
        series = [r for r in results if r["runtime"] == runtime]
        style = {"marker": marker, "linestyle": line, "fillstyle": fill, "color": COLORS[runtime]}
        style["label"] = f"{runtime}{suffix}"
        if series:
            workers = [r["workers"] for r in series]
            times.plot(workers, [r["steady_epoch_seconds"] for r in series], **style)
            if series[0]["parallel_efficiency"] is not None:
                efficiency.plot(workers, [r["parallel_efficiency"] for r in series], **style)


def _label(axes, doc: dict, most: int) -> None:
    times, efficiency = axes
    config = doc["config"]
    times.set(
        xlabel="workers",
        ylabel="steady-state epoch (s)",
        ylim=(0, times.get_ylim()[1] * 1.1),
        title=f"{config['qubits']} qubits, {doc['train_examples'] + doc['test_examples']} examples",
    )
    efficiency.axhline(1.0, color="black", linewidth=0.5)
    efficiency.set(
        xlabel="workers",
        ylabel="parallel efficiency",
        ylim=(0, 1.2),
        title=f"T_single / (workers x T_workers), {doc['machine_cpus']} CPUs",
    )
    for one in axes:
        one.set(xticks=range(1, most + 1), xlim=(0.8, most + 0.2))
        if one.get_legend_handles_labels()[0]:
            one.legend(fontsize=8)
