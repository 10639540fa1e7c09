"""qml_ray: train and serve TensorFlow Quantum QCNNs on Ray."""

import os

# TFQ layers are tf-keras layers: Keras 2 must be chosen before TensorFlow is imported.
# Ray workers get the same variable through the job's runtime environment (runtime.py).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
