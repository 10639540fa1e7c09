"""The scaling benchmark (`python -m qml_ray.bench`): qml_ray against the runtime it replaces,
and the QCNN's cost per circuit. BENCHMARKS.md holds the numbers and how to reproduce them."""
