"""Real git servers on 127.0.0.1 for the tests: ``git daemon`` (git://), smart HTTP (``git http-backend`` behind
a small threaded Python HTTP server, in its own process) and a server that accepts connections and never
answers (for client timeouts), plus ``make_bare``. Used by the tests (their pytest fixtures are in
tests/servers.py), the soak and the benchmarks.

Standard library only. This file is also the server program:
``python servers.py http BASE PORT`` serves smart HTTP, ``python servers.py supervise -- CMD...`` runs CMD
(``git daemon``) and kills its whole process group when the parent test process goes away.

Every server process is the leader of its own process group (session); stop() and kill() signal the whole
group, so ``git daemon``'s per-connection children and ``git http-backend``/``upload-pack`` children die
too. Running servers are also stopped at interpreter exit (atexit), and each one holds a "lifeline" pipe
from the test process: if the test process dies without cleaning up (SIGKILL), the pipe closes and the
server group kills itself.
"""

from __future__ import annotations

import atexit
import errno
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

from gitlease.core.hookgit import REPO_ENV

__all__ = [
    "free_port",
    "make_bare",
    "GitDaemon",
    "SmartHTTPServer",
    "HangingServer",
]

HOST = "127.0.0.1"
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0

# Variables that would point a server-side git at the wrong repository (or fake a protocol version).
_SERVER_DROP_ENV = REPO_ENV | {"GIT_PROTOCOL"}

_handed_out: set[int] = set()
_handed_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (and that this process has not handed
    out before, so two servers started back to back never get the same one)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        with _handed_lock:
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError("no free port on 127.0.0.1")


def _git_ok(*args: str, cwd: str | os.PathLike[str] | None = None) -> None:
    res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {res.stderr.strip()}")


def make_bare(path: str | os.PathLike[str], *, log_all_ref_updates: bool = True) -> Path:
    """``git init --bare`` at ``path`` (created if missing, may exist empty), ready for pushes over every
    transport: ``http.receivepack=true`` (smart HTTP refuses pushes otherwise), push options advertised,
    and a reflog for every ref (``core.logAllRefUpdates=always``) unless ``log_all_ref_updates=False``."""
    path = Path(path).absolute()
    _git_ok("init", "--bare", "-q", str(path))
    settings = [("http.receivepack", "true"), ("receive.advertisePushOptions", "true")]
    if log_all_ref_updates:
        settings.insert(0, ("core.logAllRefUpdates", "always"))
    for key, value in settings:
        _git_ok("config", key, value, cwd=path)
    return path


def _server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SERVER_DROP_ENV}
    if extra:
        env.update(extra)
    return env


def _wait_port(port: int, proc: subprocess.Popen, deadline: float, ready=lambda: True) -> bool:
    """Poll until ``port`` accepts a connection and ``ready()`` (our server says it is listening: a foreign
    listener on the port would accept too) -> True, or ``proc`` exits -> False; raise at the deadline."""
    pause = 0.002
    while True:
        if proc.poll() is not None:
            return False
        if ready():
            try:
                with socket.create_connection((HOST, port), timeout=0.5):
                    pass
                return proc.poll() is None
            except OSError:
                pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"server on port {port} not accepting connections after {START_TIMEOUT:g}s")
        time.sleep(pause)  # readiness poll interval (2 ms doubling to 50 ms), bounded by the deadline
        pause = min(pause * 2, 0.05)


def _group_alive(pgid: int) -> bool:
    """Whether any process (zombies excepted) is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return not os.path.isdir("/proc")


_live: set[_ProcessServer] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        try:
            server.kill()
        except Exception:
            pass


class _ProcessServer:
    """A server process in its own process group, on a fixed port (kept across restart())."""

    kind = "server"
    scheme = ""
    ready_marker: str | None = None  # a log line the server writes once it listens

    def __init__(
        self,
        base: str | os.PathLike[str],
        *,
        port: int | None = None,
        log_path: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.base = Path(base).absolute()
        self.base.mkdir(parents=True, exist_ok=True)
        self._port_chosen = port is not None
        self.port = port if port is not None else free_port()
        self.log_path = Path(log_path) if log_path else self.base.with_name(f"{self.base.name}.{self.kind}.log")
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    # -- what subclasses provide
    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _bind_failed(self, log_tail: str) -> bool:
        return "Address already in use" in log_tail

    # -- lifecycle
    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the group leader (also the process group id)."""
        return self.proc.pid if self.proc else None

    def start(self) -> _ProcessServer:
        """Start the server and wait (at most 10 s) until its port accepts connections."""
        if self.running:
            return self
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    self._argv(),
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=_server_env(self.extra_env),
                    cwd=self.base,
                    start_new_session=True,
                )
            with _live_lock:
                _live.add(self)

            def ready(offset=offset) -> bool:
                return not self.ready_marker or self.ready_marker in self._log_since(offset)

            try:
                if _wait_port(self.port, self.proc, deadline, ready):
                    self.starts += 1
                    return self
            except TimeoutError as exc:
                self.kill()
                raise TimeoutError(f"{self.kind}: {exc}; log:\n{self._log_since(offset)[-3000:]}") from None
            except BaseException:
                self.kill()
                raise
            # It exited before listening: port taken (by a foreign process, or a dying predecessor)?
            self.kill()
            tail = self._log_since(offset)
            if not self._bind_failed(tail):
                raise RuntimeError(
                    f"{self.kind} exited with {self.proc.returncode} before listening on {self.port}:\n{tail[-3000:]}"
                )
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.kind}: port {self.port} stayed in use for {START_TIMEOUT:g}s")
            if not self._port_chosen and self.starts == 0:
                self.port = free_port()  # never started yet, nobody knows the port: take another
            else:
                time.sleep(0.05)  # same port wanted (restart): retry until the deadline

    def _signal_group(self, sig: int, wait: float) -> None:
        proc = self.proc
        with _live_lock:
            stopped = self not in _live
        if proc is None or (stopped and proc.returncode is not None):
            return  # never started, or already stopped and reaped
        pgid = proc.pid
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        # Wait for the leader without reaping it: while it is a zombie its pid (= the group id) cannot be
        # reused, so the final SIGKILL below cannot hit an unrelated group.
        deadline = time.monotonic() + wait
        pause = 0.002
        while proc.returncode is None and time.monotonic() < deadline:
            if not hasattr(os, "waitid"):  # no WNOWAIT here: reap it
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                break
            try:
                if os.waitid(os.P_PID, pgid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                    break
            except ChildProcessError:
                break
            time.sleep(pause)  # waiting for a real server process to exit, bounded by the deadline
            pause = min(pause * 2, 0.05)
        try:
            os.killpg(pgid, signal.SIGKILL)  # stragglers: per-connection children, backends
        except ProcessLookupError:
            pass
        proc.wait()
        # The children are orphans now; give them a moment to actually go (they already have SIGKILL).
        deadline = time.monotonic() + 2.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if proc.stdin:
            try:
                proc.stdin.close()
            except OSError:
                pass
        with _live_lock:
            _live.discard(self)

    def stop(self) -> None:
        """SIGTERM the whole process group, wait for it (SIGKILL after 5 s)."""
        self._signal_group(signal.SIGTERM, STOP_TIMEOUT)

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash) and reap it."""
        self._signal_group(signal.SIGKILL, STOP_TIMEOUT)

    def restart(self) -> _ProcessServer:
        """Stop (if running) and start again on the same port."""
        self.stop()
        self._port_chosen = True
        return self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- addresses and logs
    def url_for(self, name: str | os.PathLike[str]) -> str:
        """URL of repository ``name`` (relative to the base dir; an absolute path inside it works too)."""
        p = Path(name)
        if p.is_absolute():
            p = p.relative_to(self.base)
        return f"{self.scheme}://{HOST}:{self.port}/{p.as_posix()}"

    def make_bare(self, name: str, **kw) -> Path:
        """A new bare repository ``name`` under the base dir (see module ``make_bare``)."""
        return make_bare(self.base / name, **kw)

    def log_text(self) -> str:
        """Everything the server (and its git children) logged, across restarts."""
        return self._log_since(0)

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<{type(self).__name__} {self.scheme}://{HOST}:{self.port} base={self.base} {state}>"


class GitDaemon(_ProcessServer):
    """``git daemon`` exporting every repository under ``base``, pushes enabled.

    Runs under a tiny supervisor (this file, ``supervise``) that is the process-group leader and kills the
    group if the test process dies. ``--verbose`` makes the daemon log each connection and the protocol
    version the client asked for (``Extended attribute "protocol": version=2``). ``--max-connections=0``:
    git daemon's default limit (32) makes it kill a live connection *from the same address* when exceeded,
    and every client here is 127.0.0.1.
    """

    kind = "git-daemon"
    scheme = "git"

    def __init__(
        self,
        base,
        *,
        port=None,
        log_path=None,
        env=None,
        verbose: bool = True,
        max_connections: int = 0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(base, port=port, log_path=log_path, env=env)
        self.verbose, self.max_connections, self.extra_args = verbose, max_connections, tuple(extra_args)
        self.ready_marker = "Ready to rumble" if verbose else None  # logged (verbose only) once bound

    def _argv(self) -> list[str]:
        daemon = [
            "git",
            "daemon",
            "--reuseaddr",
            f"--listen={HOST}",
            f"--port={self.port}",
            f"--base-path={self.base}",
            "--export-all",
            "--enable=receive-pack",
            "--informative-errors",
            f"--max-connections={self.max_connections}",
        ]
        if self.verbose:
            daemon.append("--verbose")
        return [sys.executable, os.path.abspath(__file__), "supervise", "--", *daemon, *self.extra_args, str(self.base)]

    def _bind_failed(self, log_tail: str) -> bool:
        return "unable to allocate any listen sockets" in log_tail or "Address already in use" in log_tail


class SmartHTTPServer(_ProcessServer):
    """Smart HTTP: a ThreadingHTTPServer in its own process running ``git http-backend`` (CGI) per request,
    GIT_PROJECT_ROOT=base, everything exported, REMOTE_USER=test, pushes enabled (http.receivepack=true is
    passed to the backend through GIT_CONFIG_COUNT, so any bare repository under base accepts pushes).
    The ``Git-Protocol`` request header becomes GIT_PROTOCOL (protocol v2). Request bodies may be gzip
    (git compresses large fetch negotiations) and/or chunked (pushes above http.postBuffer).

    The log has one line per request, written before the last byte of the response goes out: ``REQ <method>
    <path> status=<n> git-protocol=<header or -> encoding=<Content-Encoding or -> te=<Transfer-Encoding or ->
    in=<decoded body bytes> rc=<http-backend exit code>``, then what http-backend (and upload-pack or
    receive-pack) wrote to stderr, each line as ``    | ...``. ``requests()`` parses the REQ lines."""

    kind = "http"
    scheme = "http"
    ready_marker = "READY http://"

    def _argv(self) -> list[str]:
        return [sys.executable, "-u", os.path.abspath(__file__), "http", str(self.base), str(self.port)]

    def requests(self) -> list[dict[str, str]]:
        """The request lines of the log, parsed: [{"method":..., "path":..., "status":..., ...}]."""
        out = []
        for line in self.log_text().splitlines():
            if line.startswith("REQ "):
                _, method, path, *rest = line.split(" ")
                out.append({"method": method, "path": path, **dict(kv.split("=", 1) for kv in rest if "=" in kv)})
        return out


class HangingServer:
    """Listens on 127.0.0.1, accepts every connection and never answers (reads and discards what the client
    sends, holds the socket open) until stop(). In a thread of the test process."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.connections = 0
        self._conns: list[socket.socket] = []
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1

    @property
    def url(self) -> str:
        return f"git://{HOST}:{self.port}/x"

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.port}/x"

    def start(self) -> HangingServer:
        if self._thread is not None:
            return self
        self._sock = socket.create_server((HOST, self.port), backlog=128)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._loop, name=f"hanging-{self.port}", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        assert self._sock is not None
        while True:
            ready, _, _ = select.select([self._sock, self._wake_r, *self._conns], [], [])
            if self._wake_r in ready:
                return
            for s in ready:
                if s is self._sock:
                    conn, _ = self._sock.accept()
                    self._conns.append(conn)
                    self.connections += 1
                else:
                    try:
                        data = s.recv(65536)
                    except OSError:
                        data = b""
                    if not data:  # the client gave up
                        self._conns.remove(s)
                        s.close()

    def stop(self) -> None:
        if self._thread is None:
            return
        os.write(self._wake_w, b"x")
        self._thread.join(5)
        for s in [*self._conns, self._sock]:
            try:
                s.close()
            except OSError:
                pass
        self._conns.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._thread = None

    def __enter__(self) -> HangingServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ============================================================================ server programs (subprocess)


def _lifeline(then) -> None:
    """Call ``then`` once stdin (a pipe from the test process) reaches EOF: the parent went away."""

    def watch() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        then()

    threading.Thread(target=watch, daemon=True).start()


def _kill_own_group() -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _supervise_main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    _lifeline(_kill_own_group)
    # SIGTERM reaches the child through the group; just exit with it.
    signal.signal(signal.SIGTERM, lambda *a: None)
    code = child.wait()
    return code if code >= 0 else 128 - code


def _http_main(root: str, port: int) -> int:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import unquote

    root = os.path.abspath(root)
    base_env = {k: v for k, v in os.environ.items() if k not in _SERVER_DROP_ENV}
    n = int(base_env.get("GIT_CONFIG_COUNT") or 0)
    base_env.update(
        {"GIT_CONFIG_COUNT": str(n + 1), f"GIT_CONFIG_KEY_{n}": "http.receivepack", f"GIT_CONFIG_VALUE_{n}": "true"}
    )
    log_lock = threading.Lock()

    def log(line: str) -> None:
        with log_lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, 100-continue, chunked responses
        server_version = "servers.py-git-http"

        def log_request(self, code="-", size="-") -> None:  # we log once per request ourselves
            pass

        def log_message(self, fmt, *args) -> None:
            log("MSG " + (fmt % args))

        def do_GET(self) -> None:
            self._cgi()

        do_POST = do_GET

        # -- request body
        def _raw_body(self):
            """Yield the request body as sent (de-chunked, still compressed)."""
            te = (self.headers.get("Transfer-Encoding") or "").lower()
            if "chunked" in te:
                while True:
                    size_line = self.rfile.readline(65537)
                    if not size_line:
                        raise ConnectionError("EOF in chunked body")
                    size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return
                    yield from self._exactly(size, "EOF in chunk")
                    self.rfile.readline(65537)  # CRLF after the chunk
            else:
                yield from self._exactly(int(self.headers.get("Content-Length") or 0), "EOF in body")

        def _exactly(self, left: int, eof: str):
            """Yield the next ``left`` bytes of the request, in pieces; ConnectionError(``eof``) if it ends first."""
            while left:
                data = self.rfile.read(min(left, 65536))
                if not data:
                    raise ConnectionError(eof)
                left -= len(data)
                yield data

        def _body(self, gzipped: bool):
            if not gzipped:
                yield from self._raw_body()
                return
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            for data in self._raw_body():
                out = inflater.decompress(data)
                if out:
                    yield out
            tail = inflater.flush()
            if tail:
                yield tail

        def _cgi(self) -> None:
            path, _, query = self.path.partition("?")
            if "://" in path:  # absolute-form request target
                path = "/" + path.split("://", 1)[1].partition("/")[2]
            h = self.headers
            te = (h.get("Transfer-Encoding") or "").lower()
            encoding = (h.get("Content-Encoding") or "").lower()
            gzipped = encoding in ("gzip", "x-gzip")
            env = dict(base_env)
            env.update(
                {
                    "GATEWAY_INTERFACE": "CGI/1.1",
                    "SERVER_SOFTWARE": self.server_version,
                    "SERVER_PROTOCOL": self.request_version,
                    "SERVER_NAME": HOST,
                    "SERVER_PORT": str(port),
                    "REQUEST_METHOD": self.command,
                    "SCRIPT_NAME": "",
                    "PATH_INFO": unquote(path),
                    "QUERY_STRING": query,
                    "REMOTE_ADDR": self.client_address[0],
                    "REMOTE_USER": "test",
                    "CONTENT_TYPE": h.get("Content-Type") or "",
                    "GIT_PROJECT_ROOT": root,
                    "GIT_HTTP_EXPORT_ALL": "1",
                }
            )
            for key, value in h.items():  # the usual CGI HTTP_* variables
                name = "HTTP_" + key.upper().replace("-", "_")
                if name not in (
                    "HTTP_CONTENT_TYPE",
                    "HTTP_CONTENT_LENGTH",
                    "HTTP_CONTENT_ENCODING",
                    "HTTP_TRANSFER_ENCODING",
                    "HTTP_PROXY",
                ):
                    env[name] = value
            if h.get("Git-Protocol"):
                env["GIT_PROTOCOL"] = h["Git-Protocol"]
            # We decode gzip and chunked bodies here; then the length is unknown and http-backend (and
            # receive-pack, which then reads its stdin directly) read to EOF.
            if not gzipped and "chunked" not in te:
                env["CONTENT_LENGTH"] = h.get("Content-Length") or "0"

            proc = subprocess.Popen(
                ["git", "http-backend"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=root,
            )
            errors: list[bytes] = []
            err_reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
            err_reader.start()
            received = [0]
            body_error: list[BaseException] = []

            def pump() -> None:
                sink_ok = True
                try:
                    for data in self._body(gzipped):
                        received[0] += len(data)
                        if sink_ok:
                            try:
                                proc.stdin.write(data)
                            except (BrokenPipeError, OSError):
                                sink_ok = False  # keep reading: the connection must stay in sync
                except BaseException as exc:  # noqa: BLE001 - reported below
                    body_error.append(exc)
                finally:
                    try:
                        proc.stdin.close()
                    except OSError:
                        pass

            pumper = threading.Thread(target=pump, daemon=True)
            pumper.start()
            done: list[str] = []

            def finish(status: str) -> None:
                """The backend is done: reap it and log the request *before* the client gets the last
                byte, so a test that reads the log after its git command returned sees this request."""
                if done:
                    return
                done.append(status)
                proc.stdout.close()
                proc.wait()
                pumper.join()
                err_reader.join()
                proc.stderr.close()
                if body_error:
                    self.close_connection = True
                stderr = b"".join(errors).decode("utf-8", "replace").strip()
                log(
                    f"REQ {self.command} {self.path} status={status} git-protocol={h.get('Git-Protocol', '-')}"
                    f" encoding={encoding or '-'} te={te or '-'} in={received[0]} rc={proc.returncode}"
                    + (f" body-error={body_error[0]!r}".replace(" ", "_") if body_error else "")
                    + "".join(f"\n    | {ln}" for ln in stderr.splitlines())
                )

            try:
                self._relay(proc, finish)
            finally:
                finish("aborted")  # no-op when the response went out

        def _relay(self, proc, finish) -> None:
            headers: list[tuple[str, str]] = []
            code, reason = 200, "OK"
            while True:
                line = proc.stdout.readline()
                if not line:
                    if not headers:
                        finish("500")
                        self.send_error(500, "http-backend produced no response")
                        return
                    break
                line = line.rstrip(b"\r\n")
                if not line:
                    break
                key, _, value = line.decode("latin-1").partition(":")
                key, value = key.strip(), value.strip()
                if key.lower() == "status":
                    num, _, reason = value.partition(" ")
                    code = int(num)
                else:
                    headers.append((key, value))
            chunked = self.request_version >= "HTTP/1.1"
            if chunked:  # always chunked, so the end of the body is ours to send (after finish)
                headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                headers.append(("Transfer-Encoding", "chunked"))
                self.send_response(code, reason or None)
                for key, value in headers:
                    self.send_header(key, value)
                self.end_headers()
                while True:
                    data = proc.stdout.read1(65536)
                    if not data:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                finish(str(code))
                self.wfile.write(b"0\r\n\r\n")
            else:  # HTTP/1.0 client: whole body, then close
                body = proc.stdout.read()
                finish(str(code))
                headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                self.send_response(code, reason or None)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
            self.wfile.flush()

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128

    try:
        httpd = Server((HOST, port), Handler)
    except OSError as exc:
        log(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}")
        return 98 if exc.errno == errno.EADDRINUSE else 1
    _lifeline(_kill_own_group)
    signal.signal(signal.SIGTERM, lambda *a: _kill_own_group())
    log(f"READY http://{HOST}:{port}/ root={root}")
    httpd.serve_forever()
    return 0


def _main(argv: list[str]) -> int:
    if argv[:1] == ["http"] and len(argv) == 3:
        return _http_main(argv[1], int(argv[2]))
    if argv[:1] == ["supervise"]:
        return _supervise_main(argv[1:])
    print("usage: servers.py http BASE PORT | servers.py supervise -- CMD...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
