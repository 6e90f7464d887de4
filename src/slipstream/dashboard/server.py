"""The dashboard's HTTP server: a small threaded server from the standard library.

It only reads: every request describes the engine's jobs afresh (through one shared
:class:`~slipstream.dashboard.stats.Sampler`), so the engine never pushes anything and a
slow browser cannot slow a job down. It binds 127.0.0.1 unless told otherwise.

It answers only requests addressed to it by name (:func:`host_allowed`): a loopback name,
the host it was told to bind, or a name in ``allowed_hosts``. Binding the loopback
address is not enough on its own: through DNS rebinding, a web page the user opens can
make the browser send its requests for the page's own domain to 127.0.0.1, and read the
answers; such requests carry that domain in their ``Host`` header and get 403.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from slipstream.dashboard.history import History, Poller
from slipstream.dashboard.page import job_section, page_html
from slipstream.dashboard.prometheus import CONTENT_TYPE as PROM_TYPE
from slipstream.dashboard.prometheus import metrics_text
from slipstream.dashboard.statequery import answer as state_answer
from slipstream.dashboard.statesize import StateSizes
from slipstream.dashboard.stats import Sampler
from slipstream.dashboard.svg import dag_svg

log = logging.getLogger("slipstream.dashboard")

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def host_allowed(header: str | None, names: frozenset[str], any_ip: bool = False) -> bool:
    """Whether a request whose ``Host`` header is ``header`` may be answered: its name
    (the port, if any, left out; case ignored) is one of ``names``, or with ``any_ip``
    (a server bound to every address) an IP address. A request without the header
    (HTTP/1.0) cannot come from a browser page, so it is answered."""
    if header is None:
        return True
    host = header.strip().lower()
    if host.startswith("["):
        name, sep, port = host.partition("]")
        name += sep
        port = port[1:] if port.startswith(":") else port
    else:
        name, _, port = host.partition(":")
    if port and not port.isdigit():
        return False
    if name in names:
        return True
    if not any_ip:
        return False
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
    except ValueError:
        return False
    return True


def _host_name(host: str) -> str:
    """``host`` as it appears in a ``Host`` header (an IPv6 address in brackets)."""
    host = host.lower()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class DashboardServer:
    """Serves ``/`` (the page), ``/api/jobs`` (JSON), ``/metrics`` (Prometheus) and
    per job ``/api/jobs/ID/dag.svg`` and ``/api/jobs/ID/state?vertex=V&key=K`` (a key's
    state in the last committed snapshot, :mod:`~slipstream.dashboard.statequery`). ``jobs`` returns the job handles to show.
    ``port=0`` picks a free port; :attr:`url` tells which. Requests must name the
    server by a loopback name, by ``host`` or by one of ``allowed_hosts`` (a bare name
    such as ``"dashboards.example.com"``): anything else gets 403 (see
    :func:`host_allowed`)."""

    def __init__(
        self,
        jobs: Callable[[], list[Any]],
        port: int = 0,
        host: str = "127.0.0.1",
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self._jobs = jobs
        self.allowed_hosts = LOOPBACK_NAMES | {_host_name(h) for h in (host, *allowed_hosts) if h}
        self.any_ip = host in _WILDCARDS
        self._refused_before = False
        self.sampler = Sampler()
        self.history = History()
        self.state_sizes = StateSizes()
        self._svg: dict[str, str] = {}
        self._svg_lock = threading.Lock()
        outer = self

        class Handler(_Handler):
            server_ref = outer

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="slipstream-dashboard", daemon=True
        )
        self._thread.start()
        self._poller = Poller(self.describe_all, self.history)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._poller.close()
        self.state_sizes.close()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # -- content -------------------------------------------------------------------------
    def job_list(self) -> list[Any]:
        try:
            return list(self._jobs())
        except Exception:  # noqa: BLE001
            log.exception("listing jobs failed")
            return []

    def describe_all(self) -> list[dict[str, Any]]:
        jobs = self.job_list()
        keys = {_job_id(j) for j in jobs}
        self.sampler.retain(keys)
        self.state_sizes.retain(keys)
        docs = []
        for j in jobs:
            doc = self.sampler.describe(j, _job_id(j))
            try:
                order = [v["name"] for v in doc["vertices"]]
                doc["state"] = self.state_sizes.describe(j, _job_id(j), order)
            except Exception:  # noqa: BLE001 - a watcher never fails the page
                log.exception("dashboard: the state sizes of job %s failed", _job_id(j))
                doc["state"] = None
            docs.append(doc)
        return docs

    def find(self, job_id: str) -> Any:
        for j in self.job_list():
            if _job_id(j) == job_id:
                return j
        return None

    def svg_of(self, job: Any) -> str:
        jid = _job_id(job)
        with self._svg_lock:
            svg = self._svg.get(jid)
        if svg is None:
            par: dict[str, int] = {}
            if hasattr(job, "watch"):
                try:
                    par = dict(job.watch().get("parallelism", {}))
                except Exception:  # noqa: BLE001
                    par = {}
            dag = getattr(job, "dag", None)
            svg = dag_svg(dag, par or None) if dag is not None else "<svg xmlns=\"http://www.w3.org/2000/svg\"/>"
            if par or dag is None:  # cache only once the plan (parallelism) is known
                with self._svg_lock:
                    self._svg[jid] = svg
        return svg

    def section_of(self, job: Any) -> str:
        dag = getattr(job, "dag", None)
        names = [v.name for v in dag.topological_order()] if dag is not None else []
        return job_section(_job_id(job), job.name, self.svg_of(job), names)


def _is_number(text: str) -> bool:
    try:
        return float(text) == float(text)  # not NaN
    except ValueError:
        return False


def _job_id(job: Any) -> str:
    return str(getattr(job, "id", None) or id(job))


class _Handler(BaseHTTPRequestHandler):
    server_ref: DashboardServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("dashboard: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        d = self.server_ref
        url = urlsplit(self.path)
        path = url.path
        try:
            if not host_allowed(self.headers.get("Host"), d.allowed_hosts, d.any_ip):
                self._refuse(self.headers.get("Host", ""))
            elif path in ("/", "/index.html"):
                sections = [d.section_of(j) for j in d.job_list()]
                self._send(200, "text/html; charset=utf-8", page_html(sections).encode())
            elif path == "/api/jobs":
                since = parse_qs(url.query).get("since", [None])[-1]
                if since is not None and not _is_number(since):
                    self._send(400, "text/plain", f"since={since!r}: expected seconds since the epoch\n".encode())
                    return
                jobs = d.history.attach(d.describe_all(), float(since) if since is not None else None)
                self._send(200, "application/json", json.dumps({"time": time.time(), "jobs": jobs}).encode())
            elif path == "/metrics":
                self._send(200, PROM_TYPE, metrics_text(d.describe_all))
            elif path.startswith("/api/jobs/"):
                jid, _, what = unquote(path[len("/api/jobs/") :]).partition("/")
                job = d.find(jid)
                if job is None:
                    self._send(404, "text/plain", f"no job {jid!r}\n".encode())
                elif what == "dag.svg":
                    self._send(200, "image/svg+xml", d.svg_of(job).encode())
                elif what == "section":
                    self._send(200, "text/html; charset=utf-8", d.section_of(job).encode())
                elif what == "state":
                    q = parse_qs(url.query, keep_blank_values=True)
                    code, body = state_answer(job, jid, q.get("vertex", [None])[-1], q.get("key", [None])[-1])
                    self._send(code, "application/json", json.dumps(body).encode())
                else:
                    self._send(404, "text/plain", b"not found\n")
            else:
                self._send(404, "text/plain", b"not found\n")
        except BrokenPipeError:
            pass
        except Exception as e:  # noqa: BLE001 - report, keep serving
            log.exception("dashboard request %s failed", path)
            self._send(500, "text/plain", f"{type(e).__name__}: {e}\n".encode())

    def _refuse(self, host: str) -> None:
        d = self.server_ref
        # once at WARNING: a page retrying through DNS rebinding must not flood the log
        level = logging.DEBUG if d._refused_before else logging.WARNING
        d._refused_before = True
        log.log(
            level,
            "dashboard: refused a request for host %r (not a name of this server: a web "
            "page trying DNS rebinding?)",
            host,
        )
        names = ", ".join(sorted(d.allowed_hosts))
        self._send(
            403,
            "text/plain",
            f"this dashboard answers only requests for {names}; "
            f"the request was for host {host!r}\n".encode(),
        )

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)
