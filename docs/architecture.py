"""Draws docs/architecture.png, the README's picture: how a run flows from the command to the
workers and to storage.  Run: python docs/architecture.py"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# (x, y, text): the boxes' centres, in a 12 x 6 frame
BOXES = {
    "command": (1.6, 4.6, "python -m qml_ray.train\n(the driver: config, checks,\nrun folder, console)"),
    "controller": (5.6, 4.6, "Ray Train controller\n(DataParallelTrainer:\nrestarts, checkpoints)"),
    "workers": (9.9, 4.6, "W workers\nMultiWorkerMirroredStrategy\nKeras fit, TFQ layers,\nblock kernel (C++)"),
    "data": (5.6, 1.4, "Ray Data\none shard per worker"),
    "parquet": (1.6, 1.4, "your Parquet\n(or the QCNN's data set)"),
    "storage": (9.9, 1.4, "storage: local or gs://\ncheckpoints, weights,\nmetrics.csv, TensorBoard"),
}
# (from, to, label): the arrows between the boxes' edges
ARROWS = [
    ((3.2, 4.6), (4.3, 4.6), "starts"),
    ((6.9, 4.6), (8.2, 4.6), "one group"),
    ((3.0, 1.4), (4.5, 1.4), "read"),
    ((6.7, 1.8), (8.6, 3.8), "shards"),
    ((9.9, 3.7), (9.9, 2.2), "every epoch"),
]


def draw(path: Path) -> None:
    figure, axes = plt.subplots(figsize=(12, 6))
    axes.set(xlim=(0, 12), ylim=(0, 6))
    axes.axis("off")
    box = {"boxstyle": "round,pad=0.6", "fc": "#e8f0fb"}
    for x, y, text in BOXES.values():
        axes.text(x, y, text, ha="center", va="center", fontsize=11, bbox=box)
    for (x0, y0), (x1, y1), label in ARROWS:
        axes.annotate("", (x1, y1), (x0, y0), arrowprops={"arrowstyle": "->", "lw": 1.5})
        axes.text((x0 + x1) / 2 + 0.1, (y0 + y1) / 2 + 0.15, label, ha="left" if x0 == x1 else "center")
    axes.text(6, 5.8, "qml_ray: a training run", ha="center", fontsize=14, weight="bold")
    infer = "python -m qml_ray.infer: Ray Data actors load the weights and write predictions to the run folder"
    axes.text(6, 0.1, infer, ha="center", fontsize=10)
    figure.savefig(path, dpi=80, bbox_inches="tight")


if __name__ == "__main__":
    draw(Path(__file__).with_name("architecture.png"))
