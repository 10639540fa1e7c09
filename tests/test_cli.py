"""The config flags: every key has one, and --help says what each means."""

from qml_ray import cli, config as config_lib
from qml_ray.config import FIELDS, Config

from conftest import SMOKE, run_command

# A valid value other than the default for every config key.
CHANGED = {
    "qubits": 6,
    "layers": 2,
    "examples": 40,
    "test_fraction": 0.5,
    "seed": 3,
    "epochs": 2,
    "batch_size": 4,
    "learning_rate": 0.1,
    "hidden_activation": "relu",
    "differentiator": "block",
    "kernel_plan": "avx2 tiles=17",
    "plan_seconds": 2.5,
    "workers": 3,
    "min_workers": 2,
    "cpus_per_worker": 2,
    "checkpoint_every": 1,
    "max_failures": 0,
    "capacity_timeout": 30,
    "storage": "/tmp/elsewhere",
    "size_thread_pools": False,
    "profile_steps": "2,4",
    "profiler_port": 9430,
    "model": "mymodels:classifier",
    "callbacks": "mycallbacks:extra",
    "data": "/tmp/circuits.parquet",
    "validation_data": "gs://bucket/validation",
    "data_in_memory_mb": 0,
    "serve_batch_size": 4,
    "serve_batch_wait": 0.5,
    "serve_max_body_mb": 1.5,
}
PARAMS = {"readouts": 2, "entangler": "cz", "scale": 0.5, "deep": True}  # given as --param KEY=VALUE


def parse(*argv: str) -> Config:
    parser = cli.ArgumentParser()
    cli.add_config_flags(parser)
    return cli.config_from_args(parser.parse_args(argv))


def test_every_config_key_can_be_set_by_its_flag():
    assert set(CHANGED) | {"params"} == set(FIELDS)
    assert all(value != FIELDS[key].default for key, value in CHANGED.items())
    argv = [text for key, value in CHANGED.items() for text in (cli.flag(key), str(value))]
    argv += [text for key, value in PARAMS.items() for text in ("--param", f"{key}={value}")]
    assert config_lib.asdict(parse(*argv)) == {**CHANGED, "params": PARAMS}


def test_params_flags_go_over_the_config_files_params(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("params:\n  readouts: 1\n  entangler: cx\n")
    assert parse("--config", str(path), "--param", "readouts=3").params == {"readouts": 3, "entangler": "cx"}


def test_flags_override_the_config_file():
    config = parse("--config", str(SMOKE), "--learning-rate", "0.1", "--size-thread-pools", "FALSE")
    assert config == config_lib.load(SMOKE).replace(learning_rate=0.1, size_thread_pools=False)


def test_workers_given_as_a_number_over_a_range_is_a_fixed_count(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("workers: 8-32\n")
    assert (parse("--config", str(path)).min_workers, parse("--config", str(path)).workers) == (8, 32)
    fixed = parse("--config", str(path), "--workers", "4")
    assert (fixed.workers, fixed.elastic) == (4, False)
    assert parse("--config", str(path), "--workers", "2-6").worker_range == "2-6"


def test_help_says_what_every_config_key_means():
    done = run_command("train", "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    text = " ".join(done.stdout.split())  # argparse wraps the help
    for key in set(FIELDS) - {"params"}:
        assert f"{cli.flag(key)} " in text
        assert " ".join(config_lib.doc(key).split()) in text, key
    assert "--param KEY=VALUE" in text
