"""The kernel's SIMD paths: the fastest one this CPU runs is chosen, every one it runs can be forced, and a
forced path it cannot run (or no path at all) ends a command with one error line before it starts anything.
A CPU without AVX-512, or without AVX, is qemu's emulation of one."""

import platform
import shutil
import subprocess
import sys

import pytest

from qml_ray import kernel

from conftest import command_env, require, run_command

X86_PATHS = (("avx512", {"avx512f", "avx512dq", "avx512bw", "avx512vl", "avx2", "fma"}), ("avx2", {"avx2", "fma"}))
ON_X86 = platform.machine() in ("x86_64", "AMD64")


def cpuinfo_flags() -> set[str]:
    """The CPU's flags as Linux lists them."""
    with open("/proc/cpuinfo") as f:
        return set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())


def chosen_in_a_new_process(path: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from qml_ray import kernel; print(kernel.PATH)"],
        env=command_env(QML_RAY_KERNEL_PATH=path),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.core
def test_the_fastest_path_is_chosen_and_every_supported_one_can_be_forced():
    flags = cpuinfo_flags() if ON_X86 else set()
    expected = [path for path, needs in X86_PATHS if ON_X86 and needs <= flags] + ["portable"]
    assert kernel.supported_paths() == expected
    assert chosen_in_a_new_process(None).stdout.strip() == expected[0]
    for path in expected:
        done = chosen_in_a_new_process(path)
        assert (done.returncode, done.stdout.strip()) == (0, path), done.stderr


def test_an_unknown_path_is_one_error_line():
    done = run_command("bench", "circuits", "--qubits", 4, env=command_env(QML_RAY_KERNEL_PATH="sve"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: QML_RAY_KERNEL_PATH=sve names no kernel path: use one of avx512, avx2, portable"
    ]


@pytest.mark.parametrize(
    "cpu, forced, features, runs",
    [
        ("Haswell", "avx512", "sse4.2 avx avx2 fma", "avx2, portable"),
        ("Nehalem", "avx2", "sse4.2", "portable"),
    ],
)
def test_a_path_the_cpu_lacks_is_one_error_line(tmp_path, cpu, forced, features, runs):
    """On an emulated CPU without the forced path's instructions: one line naming the path and the CPU's
    features, exit status 2, nothing written."""
    if not ON_X86:
        pytest.skip("the x86-64 paths are emulated on x86-64 machines only")
    qemu = shutil.which("qemu-x86_64")
    require(qemu is not None, "qemu-x86_64 is not installed (Debian: apt-get install qemu-user)")
    out = tmp_path / "bench"
    # OpenBLAS (numpy's) takes qemu's emulated Nehalem for a Haswell and dies on its first AVX instruction
    # before the kernel is asked: it is told the CPU (its names are qemu's).
    done = subprocess.run(
        [qemu, "-cpu", cpu, sys.executable, "-m", "qml_ray.bench", "circuits", "--qubits", "4", "--out", str(out)],
        env=command_env(QML_RAY_KERNEL_PATH=forced, OPENBLAS_CORETYPE=cpu),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if not line.startswith("qemu-x86_64: warning")]
    assert done.returncode == 2, done.stderr
    assert lines == [
        f"error: QML_RAY_KERNEL_PATH={forced}: this CPU cannot run the {forced} kernel (its features: {features}); "
        f"it runs {runs}"
    ]
    assert not out.exists()
