"""Tests for slipstream.spark.session."""

from __future__ import annotations

import importlib
import os
import stat
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from slipstream.spark import session as spark_session_mod
from slipstream.spark.session import (
    DEFAULT_DRIVER_JAVA_OPTIONS,
    SparkUnavailableError,
    check_spark_available,
    default_session_conf,
    prepare_environment,
    spark_home,
)

TEXT = (
    """\
the quick brown fox jumps over the lazy dog
the dog barks and the fox runs
a stream is a batch that never ends
batch or stream the dag is the same dag
"""
    * 25
)

ENV_KEYS = (
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "SPARK_LOCAL_IP",
    "SPARK_CONF_DIR",
)


# --------------------------------------------------------------- fast tests


@pytest.mark.spark
def test_check_spark_available_passes_here() -> None:
    check_spark_available()
    home = Path(spark_home())
    assert (home / "bin" / "spark-class").is_file()
    assert (home / "jars").is_dir()


def test_importing_session_module_does_not_import_pyspark() -> None:
    code = (
        "import sys\n"
        "import slipstream.spark.session\n"
        "import slipstream.spark.gateway\n"
        "import slipstream.spark.standalone\n"
        "bad = sorted(m for m in sys.modules if m == 'pyspark' or m.startswith('pyspark.'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_missing_pyspark_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # makes `import pyspark` fail
    with pytest.raises(SparkUnavailableError, match=r"pip install -e '\.\[spark\]' in the slipstream checkout"):
        check_spark_available()


def test_missing_java_on_path_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkUnavailableError, match="openjdk-17-jre-headless") as info:
        check_spark_available()
    assert "Java 17" in str(info.value)
    assert issubclass(SparkUnavailableError, RuntimeError)


def test_bad_java_home_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(SparkUnavailableError, match="JAVA_HOME"):
        check_spark_available()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Remove the variables prepare_environment sets; monkeypatch restores them."""
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_prepare_environment_writes_conf_and_sets_env(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    conf_dir = prepare_environment(str(tmp_path))
    assert Path(conf_dir) == tmp_path / "conf"
    assert os.environ["SPARK_CONF_DIR"] == conf_dir
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"

    log4j = (Path(conf_dir) / "log4j2.properties").read_text()
    assert "rootLogger.level = error" in log4j
    defaults = dict(
        line.split(None, 1)
        for line in (Path(conf_dir) / "spark-defaults.conf").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert defaults["spark.ui.showConsoleProgress"] == "false"
    assert defaults["spark.ui.enabled"] == "false"
    assert defaults["spark.driver.host"] == "127.0.0.1"
    assert defaults["spark.driver.bindAddress"] == "127.0.0.1"
    assert Path(defaults["spark.local.dir"]).is_dir()
    assert Path(defaults["spark.local.dir"]).is_relative_to(tmp_path)

    # Idempotent: same dir, same content, no extra files.
    before = sorted(p.name for p in Path(conf_dir).iterdir())
    assert prepare_environment(str(tmp_path)) == conf_dir
    assert sorted(p.name for p in Path(conf_dir).iterdir()) == before


def test_prepare_environment_respects_existing_values(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("PYSPARK_PYTHON", "/opt/other/python3")
    clean_env.setenv("SPARK_LOCAL_IP", "127.0.0.2")
    prepare_environment(str(tmp_path))
    assert os.environ["PYSPARK_PYTHON"] == "/opt/other/python3"
    assert os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.2"


def test_prepare_environment_default_dir(clean_env: pytest.MonkeyPatch) -> None:
    conf_dir = prepare_environment()
    root = Path(tempfile.gettempdir()) / f"slipstream-{os.geteuid()}"
    assert Path(conf_dir).is_relative_to(root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert prepare_environment() == conf_dir
    assert (Path(conf_dir) / "spark-defaults.conf").is_file()


def _planted_root(tmp_path: Path, uid: int, how: str) -> Path:
    """A ``slipstream-<uid>`` dir holding a planted Spark config that is not private:
    group/other-writable, someone else's, or a symlink to someone else's dir."""
    legacy = tmp_path / "slipstream-spark-conf"  # the shared name used before
    (legacy / "conf").mkdir(parents=True)
    (legacy / "conf" / "spark-env.sh").write_text("planted\n")
    legacy.chmod(0o777)
    root = tmp_path / f"slipstream-{uid}"
    target = tmp_path / "attacker" if how == "symlink" else root
    (target / "spark-conf" / "conf").mkdir(parents=True)
    (target / "spark-conf" / "conf" / "spark-defaults.conf").write_text("planted\n")
    if how == "symlink":
        root.symlink_to(target)
    elif how == "open":
        root.chmod(0o777)
    else:
        root.chmod(0o700)
    return root


@pytest.mark.parametrize("how", ["open", "foreign", "symlink"])
def test_prepare_environment_never_uses_a_planted_default_dir(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, how: str
) -> None:
    clean_env.setattr(tempfile, "tempdir", str(tmp_path))
    clean_env.setattr(spark_session_mod, "_prepared", {})
    uid = os.geteuid()
    if how == "foreign":
        # the dir belongs to this process's real uid; pretending to be another user
        # makes it "someone else's" without needing root to chown it
        uid += 1
        clean_env.setattr(os, "geteuid", lambda: uid)
    root = _planted_root(tmp_path, uid, how)
    conf_dir = Path(prepare_environment())
    assert not conf_dir.resolve().is_relative_to(root.resolve())
    assert sorted(p.name for p in conf_dir.iterdir()) == [
        "log4j2.properties",
        "spark-defaults.conf",
    ]
    # every directory from tmp_path down to the conf dir is this user's alone
    d = conf_dir
    while d != tmp_path:
        st = d.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.stat(tmp_path).st_uid, d
        assert d == conf_dir or not st.st_mode & 0o077, f"{d} is open to others"
        d = d.parent


def test_private_dir_checks(tmp_path: Path) -> None:
    from slipstream.core.files import UnsafeDirectoryError, private_dir

    made = private_dir(tmp_path / "mine")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert private_dir(made) == made  # an existing private dir is fine
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "open").chmod(0o755)
    with pytest.raises(UnsafeDirectoryError, match="open to other users"):
        private_dir(tmp_path / "open")
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(UnsafeDirectoryError, match="not a directory"):
        private_dir(tmp_path / "link")


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local[2]", "2"),
        ("local[3]", "3"),
        ("local[1, 4]", "1"),
        ("local[*]", str(os.cpu_count() or 1)),
        ("local", "2"),
        ("spark://127.0.0.1:7077", "2"),
    ],
)
def test_default_session_conf(master: str, expected: str) -> None:
    conf = default_session_conf(master)
    assert conf["spark.default.parallelism"] == expected
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "4"
    assert conf["spark.driver.extraJavaOptions"] == DEFAULT_DRIVER_JAVA_OPTIONS
    assert conf["spark.python.worker.reuse"] == "true"


def test_create_session_user_conf_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """create_session's conf layering, with a fake builder (no JVM)."""
    pytest.importorskip("pyspark")
    import pyspark.sql

    recorded: dict[str, Any] = {}

    class FakeBuilder:
        def master(self, m: str) -> FakeBuilder:
            recorded["master"] = m
            return self

        def appName(self, name: str) -> FakeBuilder:  # noqa: N802 - mirrors pyspark
            recorded["app"] = name
            return self

        def config(self, key: str, value: str) -> FakeBuilder:
            recorded.setdefault("conf", {})[key] = value
            return self

        def getOrCreate(self) -> str:  # noqa: N802 - mirrors pyspark
            return "session"

    class FakeSparkSession:
        builder = FakeBuilder()

    monkeypatch.setattr(spark_session_mod, "check_spark_available", lambda: None)
    monkeypatch.setattr(spark_session_mod, "prepare_environment", lambda *a: "conf")
    monkeypatch.setattr(pyspark.sql, "SparkSession", FakeSparkSession)
    result = spark_session_mod.create_session(
        "local[3]", "app-x", conf={"spark.sql.shuffle.partitions": "8", "spark.x": "y"}
    )
    assert result == "session"
    assert recorded["master"] == "local[3]"
    assert recorded["app"] == "app-x"
    assert recorded["conf"]["spark.sql.shuffle.partitions"] == "8"
    assert recorded["conf"]["spark.x"] == "y"
    assert recorded["conf"]["spark.default.parallelism"] == "3"
    assert recorded["conf"]["spark.driver.host"] == "127.0.0.1"


# --------------------------------------------------------------- Spark tests


def _executor_info(_: object) -> tuple[str, str]:
    mod = importlib.import_module("slipstream.spark.session")
    return sys.executable, mod.LOOPBACK


@pytest.mark.slow
@pytest.mark.spark
def test_rdd_word_count(spark_session: Any) -> None:
    sc = spark_session.sparkContext
    conf = sc.getConf()
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.ui.enabled") == "false"
    assert sc.defaultParallelism == 2

    lines = TEXT.splitlines()
    counts = dict(
        sc.parallelize(lines, 4)
        .flatMap(lambda line: line.split())
        .map(lambda word: (word, 1))
        .reduceByKey(lambda a, b: a + b)
        .collect()
    )
    assert counts == dict(Counter(TEXT.split()))

    # Executors run this interpreter and can import slipstream.
    info = set(sc.parallelize(range(4), 2).map(_executor_info).collect())
    assert info == {(sys.executable, "127.0.0.1")}
