"""The cost per circuit as plots, from a `circuits` run's circuits.json: circuits.png (seconds per
circuit against qubits, TFQ against the block kernel), when the run timed the peers, peers.png (the
block kernel beside qsim and PennyLane Lightning on the same circuits), and roofline.png (the kernel's
passes against this machine's peaks).

    python -m qml_ray.bench.figures benchmarks/circuits benchmarks/circuits-compiled

draws them again from the recorded JSON, without timing anything.
"""

import json
import sys
from pathlib import Path

# (the probe's key, its label, its style): forward dashed, forward + gradient solid
SCALING = [
    ("tfq_forward_seconds", "TFQ forward", "C1--"),
    ("tfq_forward_gradient_seconds", "TFQ forward + Adjoint gradient", "C1-"),
    ("block_forward_seconds", "block kernel forward", "C0--"),
    ("block_forward_gradient_seconds", "block kernel forward + BlockAdjoint gradient", "C0-"),
]
# (label, seconds per circuit from a probe's peers): forwards, then gradients (their forwards included)
PEERS = [
    ("block forward", lambda p: p["block"]["forward_seconds"]),
    ("qsim forward", lambda p: p["qsim"]["seconds"]),
    ("block forward + gradient", lambda p: p["block"]["gradient_seconds"]),
    ("Lightning adjoint, complex64", lambda p: p["lightning_complex64"]["seconds"]),
]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def title(doc: dict) -> str:
    """The run's kernel path (when it recorded one) and threads."""
    threads = f"{doc['threads']} thread{'s' if doc['threads'] > 1 else ''}"
    return f"{doc['kernel_path']} path, {threads}" if doc.get("kernel_path") else threads


def plot_scaling(doc: dict, path: Path) -> None:
    """Seconds per circuit against qubits, forward and forward + gradient, TFQ and the block kernel."""
    plt = pyplot()
    probes = doc["probes"]
    qubits = [p["qubits"] for p in probes]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for key, label, style in SCALING:
        axes.plot(qubits, [p[key] for p in probes], style, marker="o", label=label)
    axes.set(yscale="log", xlabel="qubits", ylabel="seconds per circuit", xticks=qubits)
    axes.set_title(f"Cost per circuit ({title(doc)})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_peers(doc: dict, path: Path) -> None:
    """Seconds per circuit of the block kernel and the peers on the same circuits, per qubit count."""
    plt = pyplot()
    probes = [p for p in doc["probes"] if p.get("peers")]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / len(PEERS)
    for index, (label, seconds) in enumerate(PEERS):
        places = [position + (index - (len(PEERS) - 1) / 2) * width for position in range(len(probes))]
        axes.bar(places, [seconds(p["peers"]) for p in probes], width, label=label)
    axes.set_xticks(range(len(probes)), [f"{p['qubits']} qubits" for p in probes])
    axes.set(yscale="log", ylabel="seconds per circuit")
    axes.set_title(f"The block kernel and the peers, same circuits ({title(doc)})")
    axes.grid(True, axis="y", which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_roofline(doc: dict, path: Path) -> None:
    """The roofline: operations per second against operations per byte, the machine's peak and its in-place
    pass's bandwidth in cache and from memory as lines, each pass kind of the kernel as a point in each."""
    plt = pyplot()
    found = next(p["roofline"] for p in doc["probes"] if p.get("roofline"))
    peak = found["peak_flops"] / 1e9
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for index, where in enumerate(("in cache", "from memory")):
        bandwidth = found[f"pass_bandwidth {where}"] / 1e9
        intensity = [0.05, peak / bandwidth, 20.0]  # the roof bends where the bandwidth meets the peak
        axes.plot(intensity, [min(peak, bandwidth * x) for x in intensity], f"C{index}-", label=f"roof, {where}")
        for kind, measured in found["kinds"].items():
            x = (
                max(measured["flops_per_amplitude"], 0.1 * measured["bytes_per_amplitude"])
                / measured["bytes_per_amplitude"]
            )
            rate = max(measured[where]["flops"], 0.1 * measured[where]["bytes"]) / 1e9
            axes.plot([x], [rate], f"C{index}o")
            axes.annotate(kind, (x, rate), fontsize=7, textcoords="offset points", xytext=(4, -10 if index else 4))
    axes.axhline(peak, color="k", linestyle=":", label=f"peak {peak:.0f} GFLOP/s (float32 matrix products)")
    axes.set(xscale="log", yscale="log", xlabel="FLOP per byte (a relabelling drawn at 0.1)", ylabel="GFLOP/s")
    axes.set_title(f"The kernel's passes on the roofline ({title(doc)})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def draw(doc: dict, folder: Path) -> list[Path]:
    """circuits.png, peers.png when the run timed the peers, roofline.png when it measured the roofline, in
    `folder`; the paths written."""
    paths = [folder / "circuits.png"]
    plot_scaling(doc, paths[0])
    if any(p.get("peers") for p in doc["probes"]):
        paths.append(folder / "peers.png")
        plot_peers(doc, paths[-1])
    if any(p.get("roofline") for p in doc["probes"]):
        paths.append(folder / "roofline.png")
        plot_roofline(doc, paths[-1])
    return paths


if __name__ == "__main__":
    for folder in map(Path, sys.argv[1:]):
        print(*draw(json.loads((folder / "circuits.json").read_text()), folder), sep="\n")
