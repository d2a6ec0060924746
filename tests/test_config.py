"""Configuration: defaults < shardq.yaml < SHARDQ_* environment < CLI overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardq.core.config import Config
from shardq.core.errors import ConfigError


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in an empty directory so a stray ./shardq.yaml is never read."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)


def write(tmp_path: Path, text: str, name: str = "shardq.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(
    path: Path | str | None = None, env: dict[str, str] | None = None, **overrides: Any
) -> Config:
    return Config.load(path, env=env or {}, overrides=overrides)


# -- defaults ----------------------------------------------------------------------


def test_without_file_environment_or_overrides_the_defaults_apply() -> None:
    # when nothing configures shardq
    config = load()
    # then every value is the documented default
    assert config == Config()
    assert config.broker_url == "sqlite:///shardq.db"
    assert config.region is None
    assert config.endpoint_url is None
    assert config.queue_prefix == ""
    assert config.app == "workers"
    assert config.threads == 4
    assert config.grace_seconds == 30.0
    assert config.idle_wait_seconds == 20.0
    assert config.signing_key is None
    assert config.log_format == "auto"
    assert config.log_level == "info"
    assert dict(config.workers) == {}
    assert config.source == "defaults"


def test_unrelated_environment_variables_are_ignored() -> None:
    config = load(env={"HOME": "/root", "SHARDQ": "x", "AWS_REGION": "eu-west-1"})
    assert config == Config()


# -- the file ------------------------------------------------------------------------


def test_a_yaml_file_sets_values(tmp_path: Path) -> None:
    # given a config file setting every kind of value
    path = write(
        tmp_path,
        """
broker_url: sqs://
region: eu-west-1
endpoint_url: http://127.0.0.1:4566
queue_prefix: prod-
app: myapp.workers:app
threads: 8
grace_seconds: 5
idle_wait_seconds: 2.5
signing_key: s3cret
log_format: json
log_level: debug
workers:
  SyncOrder: {shards: 16, batch_size: 10}
""",
    )
    # when it is loaded
    config = load(path)
    # then every value comes from the file, and the source names it
    assert config.broker_url == "sqs://"
    assert config.region == "eu-west-1"
    assert config.endpoint_url == "http://127.0.0.1:4566"
    assert config.queue_prefix == "prod-"
    assert config.app == "myapp.workers:app"
    assert config.threads == 8
    assert config.grace_seconds == 5.0
    assert isinstance(config.grace_seconds, float)
    assert config.idle_wait_seconds == 2.5
    assert config.signing_key == "s3cret"
    assert config.log_format == "json"
    assert config.log_level == "debug"
    assert config.workers == {"SyncOrder": {"shards": 16, "batch_size": 10}}
    assert config.source == str(path)


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "# nothing here\n")
    config = load(path)
    assert config.threads == 4
    assert config.source == str(path)


def test_the_file_can_be_named_by_shardq_config(tmp_path: Path) -> None:
    # given SHARDQ_CONFIG naming a file
    path = write(tmp_path, "threads: 3\n", name="other.yaml")
    # when the config is loaded without a path
    config = load(env={"SHARDQ_CONFIG": str(path)})
    # then that file is read (and SHARDQ_CONFIG is not itself a setting)
    assert config.threads == 3
    assert config.source == str(path)


@pytest.mark.parametrize(
    ("path", "env"),
    [("", {}), (" ", {}), (None, {"SHARDQ_CONFIG": ""})],
    ids=["flag", "space", "env"],
)
def test_an_empty_config_path_is_refused_not_taken_for_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str | None, env: dict[str, str]
) -> None:
    # given a shardq.yaml in the working directory, and a config path that came out empty
    # (`--config "$CONFIG"` with CONFIG unset)
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "threads: 3\n", name="shardq.yaml")
    # when the config is loaded, then it is refused, saying what to do
    with pytest.raises(ConfigError, match=r"config file path .* is empty: name a file"):
        load(path, env=env)


def test_an_explicit_path_wins_over_shardq_config(tmp_path: Path) -> None:
    explicit = write(tmp_path, "threads: 2\n", name="explicit.yaml")
    named = write(tmp_path, "threads: 9\n", name="named.yaml")
    config = load(explicit, env={"SHARDQ_CONFIG": str(named)})
    assert config.threads == 2


def test_shardq_yaml_in_the_current_directory_is_read_when_present() -> None:
    # given ./shardq.yaml
    Path("shardq.yaml").write_text("threads: 6\n", encoding="utf-8")
    # when the config is loaded without a path
    config = load()
    # then it is read
    assert config.threads == 6
    assert config.source == "shardq.yaml"


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    # given a path that does not exist
    missing = tmp_path / "nope.yaml"
    # when it is loaded
    with pytest.raises(ConfigError) as caught:
        load(missing)
    # then the error names the file and the reason
    message = str(caught.value)
    assert f"cannot read config file {missing}" in message
    assert "No such file" in message


def test_invalid_yaml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "threads: [8\nworkers: {\n")
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert f"{path} is not valid YAML" in str(caught.value)


def test_a_file_that_is_not_utf8_is_an_error_naming_the_file(tmp_path: Path) -> None:
    # given a config file saved in another encoding (Latin-1, or UTF-16 with its BOM)
    path = tmp_path / "shardq.yaml"
    path.write_bytes("queue_prefix: caf\u00e9-\n".encode("latin-1"))
    # when it is loaded
    with pytest.raises(ConfigError) as caught:
        load(path)
    # then the error names the file and says it is not UTF-8 (no traceback)
    assert f"cannot read config file {path}" in str(caught.value)
    assert "UTF-8" in str(caught.value)


@pytest.mark.parametrize("text", ["- threads\n- 8\n", "just a string\n", "42\n"])
def test_a_top_level_that_is_not_a_mapping_is_an_error_naming_the_file(
    tmp_path: Path, text: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value) == f"{path}: expected a mapping of settings at the top level"


def test_an_unknown_top_level_key_is_an_error_naming_key_and_file(tmp_path: Path) -> None:
    # given a file with a misspelt key
    path = write(tmp_path, "thread: 8\nqueue_prefix: p-\n")
    # when it is loaded
    with pytest.raises(ConfigError) as caught:
        load(path)
    # then the error names the file and the key, and lists the known keys
    message = str(caught.value)
    assert message.startswith(f"{path}: unknown key thread;")
    assert "threads" in message
    assert "queue_prefix" in message


def test_source_is_not_a_key_of_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "source: elsewhere\n")
    with pytest.raises(ConfigError, match="unknown key source"):
        load(path)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("threads: abc\n", "threads", "expected an integer, got 'abc'"),
        ("threads: 0\n", "threads", "expected an integer from 1 to 256, got 0"),
        ("threads: -2\n", "threads", "expected an integer from 1 to 256, got -2"),
        ("threads: 2.5\n", "threads", "expected an integer from 1 to 256, got 2.5"),
        ("threads: true\n", "threads", "got True"),
        ("threads: [1]\n", "threads", "expected a number"),
        ("grace_seconds: soon\n", "grace_seconds", "expected a number, got 'soon'"),
        ("grace_seconds: 3601\n", "grace_seconds", "expected 0 to 3600"),
        ("grace_seconds: true\n", "grace_seconds", "expected a number, got True"),
        ("idle_wait_seconds: 0\n", "idle_wait_seconds", "expected more than 0"),
        ("idle_wait_seconds: 21\n", "idle_wait_seconds", "at most 20"),
        ("prefetch: 0\n", "prefetch", "expected an integer from 1 to 10, got 0"),
        ("prefetch: 11\n", "prefetch", "expected an integer from 1 to 10, got 11"),
        ("prefetch: 1.5\n", "prefetch", "expected an integer from 1 to 10, got 1.5"),
        ("progress_seconds: -1\n", "progress_seconds", "expected 0 to 86400"),
        ("log_format: xml\n", "log_format", "expected one of auto, console, json"),
        ("log_level: verbose\n", "log_level", "expected one of debug, info, warning, error"),
        ("log_level: 3\n", "log_level", "expected a string"),
        ("queue_prefix: 'prod.'\n", "queue_prefix", "expected letters, digits"),
        ('queue_prefix: "prod-\\n"\n', "queue_prefix", "expected letters, digits"),
        ("broker_url: shardq.db\n", "broker_url", "expected a URL"),
        ("region: 5\n", "region", "expected a string or null"),
        ("connect_timeout: 0\n", "connect_timeout", "expected seconds above 0"),
        ("connect_timeout: soon\n", "connect_timeout", "expected a number, got 'soon'"),
        ("read_timeout: -1\n", "read_timeout", "expected seconds above 0"),
        ("read_timeout: .nan\n", "read_timeout", "(a finite number), got nan"),
        ("read_timeout: .inf\n", "read_timeout", "(a finite number), got inf"),
        ("read_timeout: 1e12\n", "read_timeout", "above 0 and at most 300 (a finite number)"),
        ("workers: [SyncOrder]\n", "workers", "expected a mapping"),
        ("workers: {SyncOrder: 16}\n", "workers", "expected a mapping"),
    ],
)
def test_an_invalid_value_in_the_file_is_an_error_naming_file_and_key(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    # given a file with one invalid value
    path = write(tmp_path, text)
    # when it is loaded
    with pytest.raises(ConfigError) as caught:
        load(path)
    # then the error starts with the file and the key, and says what is expected
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}: ")
    assert problem in message


def test_a_null_workers_section_means_no_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "workers:\n")
    assert dict(load(path).workers) == {}


# -- the environment ----------------------------------------------------------------


def test_environment_variables_override_the_file(tmp_path: Path) -> None:
    # given a file and environment variables for some of its keys
    path = write(tmp_path, "threads: 8\nqueue_prefix: file-\nlog_level: debug\n")
    env = {"SHARDQ_THREADS": "2", "SHARDQ_QUEUE_PREFIX": "env-", "SHARDQ_GRACE_SECONDS": "1.5"}
    # when the config is loaded
    config = load(path, env=env)
    # then the environment wins, keys only in the file keep the file's value
    assert config.threads == 2
    assert config.queue_prefix == "env-"
    assert config.grace_seconds == 1.5
    assert config.log_level == "debug"
    # and the source names both
    assert config.source == f"{path} + environment"


def test_environment_strings_are_used_as_is_for_string_settings() -> None:
    config = load(env={"SHARDQ_SIGNING_KEY": "123", "SHARDQ_REGION": "us-east-1"})
    assert config.signing_key == "123"
    assert config.region == "us-east-1"


def test_null_in_the_environment_unsets_a_setting_that_takes_null(tmp_path: Path) -> None:
    # given a file that sets every top-level key that takes null
    path = write(
        tmp_path,
        "signing_key: secret\nmetrics_port: 9100\nmorgue_retention_days: 90\n"
        "store_url: dynamodb://?region=us-east-1\nendpoint_url: http://127.0.0.1:4566\n"
        "region: us-east-1\ndashboard_token: t\n",
    )
    keys = ["signing_key", "metrics_port", "morgue_retention_days", "store_url"]
    keys += ["endpoint_url", "region", "dashboard_token"]
    # when the environment sets each to null (as a worker setting can be)
    config = load(path, env={f"SHARDQ_{key.upper()}": "null" for key in keys})
    # then each is unset, not the text "null" (a signing key "null" would sign with it)
    assert {key: getattr(config, key) for key in keys} == dict.fromkeys(keys)
    # and a setting that cannot be null keeps the text, as it always did
    assert load(env={"SHARDQ_QUEUE_PREFIX": "null"}).queue_prefix == "null"


def test_a_worker_setting_can_be_set_from_the_environment() -> None:
    # given SHARDQ_WORKERS__<Worker>__<key> variables
    env = {
        "SHARDQ_WORKERS__SyncOrder__shards": "16",
        "SHARDQ_WORKERS__SyncOrder__TIME_LIMIT": "2.5",
        "SHARDQ_WORKERS__SyncOrder__queue_name": "orders",
        "SHARDQ_WORKERS__HTTPPing__time_limit": "null",
    }
    # when the config is loaded
    config = load(env=env)
    # then they become worker overrides: numbers and null parsed, keys lower-cased,
    # worker names kept as written
    assert config.workers == {
        "SyncOrder": {"shards": 16, "time_limit": 2.5, "queue_name": "orders"},
        "HTTPPing": {"time_limit": None},
    }


@pytest.mark.parametrize(("raw", "value"), [("1e3", 1000.0), ("2.5E1", 25.0), ("1_000", 1000)])
def test_a_worker_number_from_the_environment_reads_as_a_top_level_one_does(
    raw: str, value: float
) -> None:
    # given a worker's number and a top-level number written alike (YAML alone reads
    # "1e3" as text)
    env = {"SHARDQ_WORKERS__SyncOrder__time_limit": raw, "SHARDQ_GRACE_SECONDS": raw}
    # when the config is loaded
    config = load(env=env)
    # then both are that number
    assert config.workers["SyncOrder"]["time_limit"] == value == config.grace_seconds


@pytest.mark.parametrize("name", ["2024", "0x10", "1e3", "null", "yes"])
def test_a_worker_queue_name_from_the_environment_is_kept_as_written(name: str) -> None:
    # given a queue name of digits (or other text YAML reads as a number, null or a bool)
    # when it is set from the environment / then it stays the text it is: a queue name
    config = load(env={"SHARDQ_WORKERS__SyncOrder__queue_name": name})
    assert config.workers == {"SyncOrder": {"queue_name": name}}


def test_environment_worker_settings_merge_with_the_file(tmp_path: Path) -> None:
    # given a file with overrides of two workers
    path = write(
        tmp_path,
        "workers:\n  SyncOrder: {shards: 4, batch_size: 10}\n  Other: {priority: 3}\n",
    )
    # when the environment changes one setting of one worker
    config = load(path, env={"SHARDQ_WORKERS__SyncOrder__shards": "16"})
    # then that setting changes and the rest of the file's overrides stay
    assert config.workers == {
        "SyncOrder": {"shards": 16, "batch_size": 10},
        "Other": {"priority": 3},
    }


def test_environment_values_merge_with_a_null_workers_section(tmp_path: Path) -> None:
    # given a file with an empty workers section
    path = write(tmp_path, "workers:\nthreads: 2\n")
    # when the environment sets a value
    config = load(path, env={"SHARDQ_THREADS": "3"})
    # then it loads
    assert config.threads == 3
    assert dict(config.workers) == {}


def test_an_invalid_workers_section_is_reported_even_with_environment_values(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "workers: [SyncOrder]\n")
    with pytest.raises(ConfigError) as caught:
        load(path, env={"SHARDQ_THREADS": "3"})
    assert str(caught.value).startswith(f"{path}: workers: expected a mapping")


def test_an_invalid_environment_value_names_the_key_and_the_environment() -> None:
    with pytest.raises(ConfigError) as caught:
        load(env={"SHARDQ_THREADS": "abc"})
    assert str(caught.value) == "environment: threads: expected an integer, got 'abc'"


def test_the_aws_timeouts_are_read_from_the_environment_and_checked_in_code() -> None:
    # given the timeouts in the environment, then they are read as seconds
    loaded = load(env={"SHARDQ_CONNECT_TIMEOUT": "0.5", "SHARDQ_READ_TIMEOUT": "1.5"})
    assert (loaded.connect_timeout, loaded.read_timeout) == (0.5, 1.5)
    # and a config made in code with a bad one is refused naming the key
    with pytest.raises(ConfigError, match=r"^defaults: read_timeout: expected seconds .* True$"):
        Config(read_timeout=True)
    with pytest.raises(ConfigError, match=r"^environment: connect_timeout: .* got -0.5$"):
        load(env={"SHARDQ_CONNECT_TIMEOUT": "-0.5"})


def test_an_invalid_environment_value_over_a_file_names_both(tmp_path: Path) -> None:
    path = write(tmp_path, "threads: 8\n")
    with pytest.raises(ConfigError) as caught:
        load(path, env={"SHARDQ_THREADS": "0"})
    assert str(caught.value).startswith(f"{path} + environment: threads: ")


@pytest.mark.parametrize("name", ["SHARDQ_THREAD", "SHARDQ_WORKERS", "SHARDQ_SOURCE"])
def test_an_unknown_shardq_variable_is_an_error_listing_the_known_ones(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(env={name: "1"})
    message = str(caught.value)
    assert message.startswith(f"environment: {name} is not a shardq setting")
    assert "SHARDQ_THREADS" in message


@pytest.mark.parametrize(
    "name",
    ["SHARDQ_WORKERS__SyncOrder", "SHARDQ_WORKERS__SyncOrder__shards__x", "SHARDQ_WORKERS____x"],
)
def test_a_malformed_worker_variable_says_the_expected_form(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(env={name: "1"})
    assert str(caught.value) == (f"environment: {name}: expected SHARDQ_WORKERS__<Worker>__<key>")


# -- overrides (CLI flags) ------------------------------------------------------------


def test_overrides_win_over_environment_and_file(tmp_path: Path) -> None:
    # given a file and the environment both setting threads and the prefix
    path = write(tmp_path, "threads: 8\nqueue_prefix: file-\n")
    env = {"SHARDQ_THREADS": "2", "SHARDQ_QUEUE_PREFIX": "env-"}
    # when an override sets threads
    config = load(path, env=env, threads=5)
    # then the override wins, and the environment still beats the file elsewhere
    assert config.threads == 5
    assert config.queue_prefix == "env-"
    assert config.source == f"{path} + environment + --threads"


def test_none_overrides_are_skipped() -> None:
    config = load(env={"SHARDQ_THREADS": "2"}, threads=None, log_level=None)
    assert config.threads == 2
    assert config.source == "environment"


def test_an_invalid_override_names_the_flag() -> None:
    with pytest.raises(ConfigError) as caught:
        load(idle_wait_seconds="forever")
    assert str(caught.value) == (
        "--idle-wait-seconds: idle_wait_seconds: expected a number, got 'forever'"
    )


def test_with_overrides_replaces_values_and_ignores_none() -> None:
    # given a config
    config = Config(threads=2, queue_prefix="a-")
    # when some values are replaced
    changed = config.with_overrides(threads=9, queue_prefix=None)
    # then only the non-None ones change, the original is untouched
    assert (changed.threads, changed.queue_prefix) == (9, "a-")
    assert config.threads == 2


def test_with_overrides_validates_the_result() -> None:
    with pytest.raises(ConfigError, match="threads"):
        Config().with_overrides(threads=0)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"grace_seconds": "30"}, "grace_seconds: expected a number, got '30'"),
        ({"idle_wait_seconds": None}, "idle_wait_seconds: expected a number, got None"),
        ({"metrics_port": "9100"}, "metrics_port: expected an integer or null, got '9100'"),
        ({"metrics_port": True}, "metrics_port: expected an integer or null, got True"),
        ({"queue_prefix": 5}, "queue_prefix: expected a string, got 5"),
        ({"broker_url": 5}, "broker_url: expected a string, got 5"),
        ({"signing_key": b"k"}, "signing_key: expected a string or null, got b'k'"),
        ({"store_url": 5}, "store_url: expected a string or null, got 5"),
    ],
)
def test_a_config_made_in_code_refuses_a_value_of_the_wrong_type(
    values: dict[str, Any], problem: str
) -> None:
    # given values of the wrong type, as code may pass them (text for numbers, bytes...)
    # when a Config is made of them / then a ConfigError names the key, as for a file,
    # rather than a TypeError of a comparison or a failure at the first publish
    with pytest.raises(ConfigError) as caught:
        Config(**values)
    assert str(caught.value) == f"defaults: {problem}"


def test_an_apps_own_config_is_the_base_that_file_env_and_flags_override(
    tmp_path: Path,
) -> None:
    # given an app config in code, a file, the environment and a flag
    base = Config(broker_url="sqlite:///app.db", threads=3, workers={"A": {"shards": 2}})
    path = tmp_path / "shardq.yaml"
    path.write_text("queue_prefix: f-\nworkers:\n  A: {batch_size: 5}\n")
    # when they are layered
    config = Config.load(
        path, env={"SHARDQ_THREADS": "7"}, overrides={"grace_seconds": 4}, base=base
    )
    # then each later source wins, and worker settings merge key by key
    assert (config.broker_url, config.queue_prefix, config.threads, config.grace_seconds) == (
        "sqlite:///app.db",
        "f-",
        7,
        4.0,
    )
    assert config.workers == {"A": {"shards": 2, "batch_size": 5}}
    assert config.source.startswith("the app's config + ")


@pytest.mark.parametrize(
    "url", ["notaurl", "127.0.0.1:4566", "ftp://host", "http://", "http://h:x"]
)
def test_an_endpoint_url_that_is_not_an_http_url_is_a_config_error_naming_the_key(
    url: str,
) -> None:
    with pytest.raises(ConfigError, match="environment: endpoint_url: ") as raised:
        Config.load(env={"SHARDQ_ENDPOINT_URL": url})
    assert repr(url) in str(raised.value)


@pytest.mark.parametrize(
    "env",
    [{"SHARDQ_REGION": "us east 1"}, {"SHARDQ_STORE_URL": "dynamodb://?region=us%20east%201"}],
)
def test_a_region_that_is_not_an_aws_region_s_form_is_a_config_error_naming_it(
    env: dict[str, str],
) -> None:
    # given a region with spaces (set as SHARDQ_REGION, or in store_url)
    # when the config loads, then it is refused naming the key, not blamed on credentials
    with pytest.raises(ConfigError) as raised:
        Config.load(env=env)
    assert str(raised.value).startswith("environment: ")
    assert str(raised.value).endswith(
        "region: expected an AWS region such as us-east-1, got 'us east 1'"
    )


def test_a_region_of_aws_s_form_is_accepted() -> None:
    assert Config.load(env={"SHARDQ_REGION": "eu-west-3"}).region == "eu-west-3"


def test_an_http_endpoint_url_is_accepted() -> None:
    config = Config.load(env={"SHARDQ_ENDPOINT_URL": "http://127.0.0.1:4566"})
    assert config.endpoint_url == "http://127.0.0.1:4566"
