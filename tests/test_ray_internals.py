"""qml_ray's use of Ray's private modules: in one module, checked against the Ray it was written for."""

import re

import ray

from qml_ray import ray_internals

from conftest import ROOT

PRIVATE = re.compile(r"\bray(\.\w+)*\.(_internal|_private)\b")


def test_ray_is_the_version_the_private_imports_were_checked_against():
    assert ray.__version__ == ray_internals.RAY_VERSION, (
        f"Ray is {ray.__version__}: check the private imports in qml_ray/ray_internals.py against it, "
        "then set its RAY_VERSION"
    )


def test_no_other_module_reaches_into_ray_private_modules():
    reaching = [
        str(file.relative_to(ROOT))
        for file in (ROOT / "qml_ray").rglob("*.py")
        if file.name != "ray_internals.py" and PRIVATE.search(file.read_text())
    ]
    assert reaching == []
