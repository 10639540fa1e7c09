"""tf-keras's layer seeds on Python 3.12, and what qml_ray takes from tf-keras's private modules for them.

Once `tf.keras.utils.set_random_seed` has seeded tf-keras (the QCNN does, and so do the examples and most
model functions), tf-keras 2.18 draws each new layer's seed with `random.Random.randint(1, 1e9)`. Python
3.12 refuses the float bound ("'float' object cannot be interpreted as an integer", tf-keras issue 803,
fixed in no tf-keras release for TensorFlow 2.18): every layer built after the seeding fails. Importing
this module gives tf-keras a seed generator whose `randint` takes whole-valued bounds as Python 3.11's did,
so a seeded model draws the same seeds on both. `model.py` and `quantum_layers.py` import it, so it is in
place before `replica.py` runs any model function.
"""

import random
import threading

from tf_keras.src import backend


class WholeBounds(random.Random):
    """A `random.Random` whose randint takes whole-valued float bounds (1e9), as Python 3.11's did."""

    def randint(self, a, b):
        return super().randint(int(a), int(b))


class SeedGenerator(threading.local):
    """tf-keras's per-thread seed generator (`backend._SEED_GENERATOR`): the generator set_random_seed
    puts there, continued as a WholeBounds from the same state."""

    @property
    def generator(self) -> WholeBounds | None:
        return self.__dict__.get("generator")

    @generator.setter
    def generator(self, seeded: random.Random) -> None:
        whole = WholeBounds()
        whole.setstate(seeded.getstate())
        self.__dict__["generator"] = whole


if not isinstance(backend._SEED_GENERATOR, SeedGenerator):
    seeded = getattr(backend._SEED_GENERATOR, "generator", None)  # this thread's, if seeded before
    backend._SEED_GENERATOR = SeedGenerator()
    if seeded is not None:
        backend._SEED_GENERATOR.generator = seeded
