"""TensorFlow Quantum's own code run as it is written, not converted by autograph: importing this module
adds TFQ to the libraries autograph leaves alone.

Keras converts a subclassed layer's `call` with autograph as it builds a functional model, and `fit`
converts its training step with everything that calls. TensorFlow leaves its own modules and those of the
libraries it knows (numpy, pandas, TensorFlow Probability: `CONVERSION_RULES`, in TensorFlow's private
`autograph.core.config`) unconverted, but not TFQ's: its expectation layers, PQCs, circuit layers and input
checks were parsed and rewritten in every process that built a TFQ model, 0.9 s of the 1.7 s of CPU that
building and two epochs of training the smoke config's QCNN took here. They need no conversion: their Python
branches test Python values (None, isinstance, the backend's name), never a tensor. The model's own code,
a user's too, is converted as before. Losses and predictions are unchanged (test_quantum_layers).
`model.py` and `quantum_layers.py` import it, so it is in place before `replica.py` runs any model function.
"""

from tensorflow.python.autograph.core import config

config.CONVERSION_RULES = (config.DoNotConvert("tensorflow_quantum"), *config.CONVERSION_RULES)
