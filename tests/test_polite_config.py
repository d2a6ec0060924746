"""Config and usage mistakes are refused with a message naming the mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardq.core.config import Config
from shardq.core.errors import ConfigError
from shardq.core.jobs import WorkerSettings
from shardq.core.limits import MAX_CONCURRENCY, MAX_THREADS
from tests.test_bad_input import shardq_cli


def test_threads_above_the_bound_are_refused_naming_the_key_and_bound() -> None:
    # given a config asking for 100000 threads, when it is loaded, then it is refused
    with pytest.raises(ConfigError, match=rf"threads: expected an integer from 1 to {MAX_THREADS}"):
        Config.load(env={"SHARDQ_THREADS": "100000"})
    # and the bound itself is accepted
    assert Config(threads=MAX_THREADS).threads == MAX_THREADS


def test_the_bounds_are_documented_constants() -> None:
    assert MAX_THREADS == 256
    assert MAX_CONCURRENCY == 1000


def test_a_duplicate_top_level_key_is_refused_naming_key_file_and_line(tmp_path: Path) -> None:
    # given a shardq.yaml setting threads twice
    path = tmp_path / "shardq.yaml"
    path.write_text("threads: 2\nqueue_prefix: a-\nthreads: 8\n")
    # when it is loaded, then the error names the key, the file and the second line
    with pytest.raises(ConfigError) as caught:
        Config.load(path, env={})
    text = str(caught.value)
    assert "duplicate key 'threads'" in text
    assert str(path) in text and "line 3" in text and "line 1" in text


def test_a_duplicate_worker_setting_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shardq.yaml"
    path.write_text("workers:\n  SyncOrder:\n    shards: 4\n    shards: 16\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'shards'.*line 4"):
        Config.load(path, env={})


def test_the_same_key_in_two_mappings_is_not_a_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "shardq.yaml"
    path.write_text("workers:\n  A: {shards: 2}\n  B: {shards: 3}\n")
    config = Config.load(path, env={})
    assert config.workers == {"A": {"shards": 2}, "B": {"shards": 3}}


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("SHARDQ_threads", "SHARDQ_THREADS"),
        ("SHARDQ_Queue_Prefix", "SHARDQ_QUEUE_PREFIX"),
        ("SHARDQ_config", "SHARDQ_CONFIG"),
        ("SHARDQ_workers__SyncOrder__shards", "SHARDQ_WORKERS__SyncOrder__shards"),
    ],
)
def test_an_environment_variable_in_the_wrong_case_is_refused_with_the_right_name(
    name: str, hint: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.load(env={name: "8"})
    assert f"environment: {name} is not a shardq setting" in str(caught.value)
    assert f"did you mean {hint}?" in str(caught.value)


@pytest.mark.parametrize("nodes", ["0", "-2"])
def test_plan_with_no_nodes_is_a_usage_error(tmp_path: Path, nodes: str) -> None:
    result = shardq_cli(
        "plan", "--nodes", nodes, env={"SHARDQ_BROKER_URL": f"sqlite:///{tmp_path / 'b.db'}"}
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"--nodes must be at least 1, got {nodes}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "text",
    [
        "threads: 2\nworkers: {SyncOrder: {shards: 4, shards: 16}}\n",
        "{threads: 2, threads: 8}\n",
        "{&t threads: 2, *t : 8}\n",
    ],
)
def test_a_duplicate_key_on_one_line_is_refused(tmp_path: Path, text: str) -> None:
    # given a flow mapping naming a key twice on one line
    path = tmp_path / "shardq.yaml"
    path.write_text(text)
    # when it is loaded, then it is refused, as a duplicate on two lines is
    with pytest.raises(ConfigError, match=r"duplicate key '(shards|threads)'"):
        Config.load(path, env={})


def test_a_number_too_long_to_read_is_refused_naming_the_file_or_variable(tmp_path: Path) -> None:
    # given a config file and a worker variable with an integer of 5,000 digits
    digits = "1" + "0" * 4999
    path = tmp_path / "shardq.yaml"
    path.write_text(f"threads: {digits}\n")
    # when they are loaded, then each is a ConfigError naming where it is, not a ValueError
    with pytest.raises(ConfigError, match=rf"^{path}"):
        Config.load(path, env={})
    config = Config.load(env={"SHARDQ_WORKERS__SyncOrder__shards": digits})
    settings = WorkerSettings("SyncOrder", "sync-order", 1, 1, 1, 5, 60, None)
    with pytest.raises(ConfigError, match=r"^environment: workers\.SyncOrder\.shards"):
        settings.with_overrides(config.workers["SyncOrder"], config.source)


@pytest.mark.parametrize("text", ["workers:\n  1: {shards: 2}\n", "workers:\n  null: {}\n"])
def test_a_worker_name_that_is_not_text_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "shardq.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"workers: expected a mapping of worker name"):
        Config.load(path, env={})


def test_an_empty_signing_key_is_refused_not_taken_for_no_signing(tmp_path: Path) -> None:
    # given a signing key in the file and an empty one from the environment (a secret
    # that did not load): signing and checking would silently be off
    path = tmp_path / "shardq.yaml"
    path.write_text("signing_key: s3cret\n")
    # when it is loaded, then it is refused naming the key
    with pytest.raises(ConfigError, match=r"\+ environment: signing_key: expected a non-empty"):
        Config.load(path, env={"SHARDQ_SIGNING_KEY": ""})
    with pytest.raises(ConfigError, match=r"signing_key: expected a non-empty"):
        Config(signing_key="")


def test_a_signing_key_that_is_not_text_is_refused_when_loaded() -> None:
    # given a key from an environment variable holding a byte that is not UTF-8 (Python
    # gives it as a lone surrogate), when it is loaded, then it is refused naming the key
    # rather than failing with a UnicodeEncodeError at the first publish
    with pytest.raises(ConfigError, match=r"^environment: signing_key: expected"):
        Config.load(env={"SHARDQ_SIGNING_KEY": "k\udcff"})


@pytest.mark.parametrize(
    "text",
    [
        "threads: !!python/object/apply:os.getpid []\n",
        "app: !!python/name:os.system\n",
        "workers: !!python/object:collections.OrderedDict {}\n",
    ],
)
def test_yaml_tags_that_build_python_objects_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "shardq.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{path} is not valid YAML: could not determine"):
        Config.load(path, env={})
