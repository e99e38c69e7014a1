"""The per-user, per-host renewal agent (issue 11): local holders register their leases; the agent renews all
of them in one push per store and interval (batch.renew_many) and tells each holder when its lease is lost.

- Adaptive: a round starts when a lease has ``fraction`` of its TTL left (default one half), or reaches its
  declared ``renewEvery``, whichever comes first; the round renews every lease the agent holds, so they all
  share one phase and one push per store per interval.
- It never keeps a lease alive whose holder is gone: each round it checks every holder's pid and process
  start time, and drops (does not renew) the leases of dead holders: they expire and can be reclaimed.
- A lease whose renewal cannot be confirmed before ``expires - margin`` is reported lost (stop signal).
- It stops by itself after ``idle`` seconds with nothing registered.
- Piggybacking: an ``acquire`` or ``release`` a local holder makes through the agent carries, in the same
  atomic push, the renewals of the other leases of that store and object store that are due within half their
  renewal interval; if one of those renewals is refused, the acquire or release is retried alone (the refused
  lease is found lost at the next round).

Protocol: one JSON object per line over a unix socket (``socket_path()``: a 0700 folder under
``$XDG_RUNTIME_DIR`` or ``/tmp``), peers must be the same uid. Requests ``{"op": "register", "repo", "lease",
"pid"}``, ``{"op": "status", "lease", "progress"}``, ``{"op": "unregister", "lease"}``, ``{"op": "acquire",
"repo", "remote", "scope", "pid", "ttl", "renewEvery", "replace", "who"}``, ``{"op": "release", "repo",
"remote", "lease", "who"}``, ``{"op": "ping"}``, ``{"op": "stop"}``; every answer has ``ok`` and, for a lease,
``state`` (held | lost | dropped | unknown), ``expiresAt``, ``version``, ``error``; a refusal has ``kind``
(errors.py) and ``error``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gitlease.core import errors
from gitlease.core import record as records
from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.errors import GitLeaseError, LeaseLost, NotHeld, UsageError

DEFAULT_FRACTION = 0.5
DEFAULT_IDLE = 60.0
DEFAULT_MARGIN = 5.0
GATHER = 2.0
PIGGYBACK_WINDOW = 0.5  # a lease rides along when due within this fraction of its renewal interval


class AgentRefused(GitLeaseError):
    """The agent will not do this for that holder (another signing key, say): the holder does it itself."""

    kind = "agent-refused"


def socket_path() -> str:
    explicit = os.environ.get("GITLEASE_AGENT_SOCKET")
    if explicit:
        return explicit
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/gitlease-{os.getuid()}"
    return os.path.join(base, "gitlease", "agent.sock")


@dataclass
class Registration:
    lease_id: str
    repo: str
    remote: str | None
    pid: int
    pid_start: int | None
    expires: float
    ttl: int
    renew_every: int | None
    version: int
    state: str = "held"  # held | lost | dropped
    error: str = ""
    progress: str | None = None  # a holder's note, for the next renewal

    def due_at(self, fraction: float) -> float:
        at = self.expires - self.ttl * fraction
        if self.renew_every:
            at = min(at, self.expires - self.ttl + self.renew_every)
        return at

    def interval(self, fraction: float) -> float:
        """Seconds from a renewal to the next one."""
        return self.due_at(fraction) - (self.expires - self.ttl)

    def to_json(self) -> dict:
        from gitlease.core.clock import iso

        return {
            "lease": self.lease_id,
            "state": self.state,
            "expiresAt": iso(self.expires),
            "version": self.version,
            "error": self.error,
            "repo": self.repo,
            "pid": self.pid,
        }


class Agent:
    """The renewal logic, without the socket: ``tick()`` runs one round. Clock injected."""

    def __init__(
        self,
        open_service: Callable[[str], object],
        *,
        clock: Clock = SYSTEM,
        fraction: float = DEFAULT_FRACTION,
        margin: float = DEFAULT_MARGIN,
        idle: float = DEFAULT_IDLE,
        alive: Callable[[int, int | None], bool] | None = None,
    ) -> None:
        if not 0 < fraction < 1:
            raise UsageError("the renewal fraction must be between 0 and 1")
        self.open_service = open_service
        self.clock = clock
        self.fraction, self.margin, self.idle = fraction, margin, idle
        self.alive = alive or _process_alive
        self.regs: dict[str, Registration] = {}
        self.services: dict[str, object] = {}
        self.lock = threading.Lock()
        self.idle_since = clock.monotonic()
        self.pushes = 0  # rounds that renewed something (one push per store and object store each)
        self.piggybacked = 0  # renewals that rode in an acquire's or a release's push
        self.round_renewals = 0  # renewals made by rounds
        self.round_lock = threading.Lock()  # one round, acquire or release at a time
        self.stop_event: threading.Event | None = None

    def _service(self, repo: str, remote: str | None):
        key = f"{repo}\0{remote or ''}"
        svc = self.services.get(key)
        if svc is None:
            svc = self.services[key] = self.open_service(repo, remote)
        return svc

    # ------------------------------------------------------------------ requests
    def register(self, repo: str, lease_id: str, pid: int, remote: str | None = None) -> Registration:
        svc = self._service(repo, remote)
        h = svc._held(lease_id)  # NotHeld if that worktree does not hold it
        rec = records.parse(h.record.encode("utf-8"))
        from gitlease.core.procs import process_start

        reg = Registration(
            lease_id,
            repo,
            remote,
            pid,
            process_start(pid) if pid else None,
            rec.expires,
            rec.ttl,
            rec.renew_every,
            rec.version,
        )
        with self.lock:
            self.regs[lease_id] = reg
        return reg

    def unregister(self, lease_id: str) -> Registration | None:
        with self.lock:
            reg = self.regs.pop(lease_id, None)
            if not self.regs:
                self.idle_since = self.clock.monotonic()
        return reg

    def status(self, lease_id: str, progress: str | None = None) -> Registration | None:
        with self.lock:
            reg = self.regs.get(lease_id)
            if reg is not None and progress is not None:
                reg.progress = progress
            return reg

    def _holder_service(self, repo: str, remote: str | None, who: dict | None):
        """The service for ``repo``, with the holder's identity (agent id, task, workspace) and its key."""
        from dataclasses import replace as dc_replace

        from gitlease.service.leases import LeaseService

        base = self._service(repo, remote)
        who = who or {}
        if "key" in who and who["key"] != base.signer.public_key:
            raise AgentRefused("the holder signs with another key than the agent would: it acts on its own")
        changes = {k: who[k] for k in ("agent", "task", "workspace") if who.get(k)}
        if all(getattr(base.settings, k) == v for k, v in changes.items()):
            return base
        return LeaseService(
            base.repo, dc_replace(base.settings, **changes), store=base.store, clock=base.clock, signer=base.signer
        )

    def _ready_piggyback(self, svc, exclude: set[str]):
        """Prepared renewals of the held leases that share ``svc``'s push and are due soon."""
        from gitlease.liveness import batch

        key = batch.group_key(svc)
        now = self.clock.now()
        with self.lock:
            regs = [r for r in self.regs.values() if r.state == "held" and r.lease_id not in exclude]
        picked = []
        for r in regs:
            rsvc = self._service(r.repo, r.remote)
            if batch.group_key(rsvc) != key:
                continue
            soon = r.due_at(self.fraction) - now <= r.interval(self.fraction) * PIGGYBACK_WINDOW
            if soon and (not r.pid or self.alive(r.pid, r.pid_start)):
                picked.append((rsvc, r.lease_id, r.progress))
        items, _skipped = batch.prepare(picked)  # a lease that cannot be prepared waits for its round
        return items

    def _finish_piggyback(self, items, landed: bool | None) -> None:
        from gitlease.liveness import batch

        done = batch.finish(items, landed)
        with self.lock:
            for it in items:
                reg = self.regs.get(it.lease_id)
                res = done.get(it.lease_id)
                if reg is not None and res is not None:
                    reg.expires, reg.version, reg.error = res.record.expires, res.record.version, ""
                    if reg.progress == it.progress:
                        reg.progress = None
        self.piggybacked += len(done)

    def acquire(
        self,
        repo: str,
        remote: str | None,
        scope,
        *,
        pid: int = 0,
        ttl: int | None = None,
        renew_every: int | None = None,
        replace: str | None = None,
        who: dict | None = None,
    ):
        """The holder's acquire (``LeaseService.acquire``), with due renewals in the same push; the new lease
        is registered for ``pid``. Returns (Acquired, Registration)."""
        svc = self._holder_service(repo, remote, who)
        if replace:
            self.unregister(replace)
        with self.round_lock:
            items = self._ready_piggyback(svc, {replace} if replace else set())
            landed: bool | None = None
            try:
                got = svc.acquire(
                    scope,
                    ttl=ttl,
                    holder_pid=pid,
                    renew_every=renew_every,
                    replace=replace,
                    piggyback=[it.update for it in items],
                )
                landed = got.piggybacked
            finally:
                self._finish_piggyback(items, landed)
        return got, self.register(repo, got.lease_id, pid, remote)

    def release(self, repo: str, remote: str | None, lease_id: str, *, who: dict | None = None) -> bool:
        """The holder's release, with due renewals in the same push; the lease is unregistered first."""
        svc = self._holder_service(repo, remote, who)
        self.unregister(lease_id)
        with self.round_lock:
            items = self._ready_piggyback(svc, {lease_id})
            landed: bool | None = None
            try:
                landed = svc.release(lease_id, piggyback=[it.update for it in items]).piggybacked
            finally:
                self._finish_piggyback(items, landed)
        return bool(landed)

    # --------------------------------------------------------------------- round
    def tick(self) -> float:
        """One round: drop leases of dead holders, renew what is due (and what is nearly due, to share the
        push), report losses. Returns the seconds until the next lease is due."""
        with self.round_lock:
            return self._tick()

    def _tick(self) -> float:
        from gitlease.liveness.batch import Busy, renew_many

        now = self.clock.now()
        with self.lock:
            held = [r for r in self.regs.values() if r.state == "held"]
        for r in held:
            if r.pid and not self.alive(r.pid, r.pid_start):
                r.state, r.error = "dropped", f"holder process {r.pid} is gone; not renewed"
                continue
            self._refresh(r)
        held = [r for r in held if r.state == "held"]
        # A round renews every lease once one is due (within GATHER), so all leases of this agent share one
        # phase: one push per store per renewal interval, however many leases and whenever they were acquired
        # (a lease acquired since the last round is renewed early, never late).
        due = (
            held
            if any(now + min(GATHER, r.interval(self.fraction) / 4) >= r.due_at(self.fraction) for r in held)
            else []
        )
        if due:
            sent = {r.lease_id: r.progress for r in due}
            results = renew_many([(self._service(r.repo, r.remote), r.lease_id, r.progress) for r in due])
            self.pushes += 1
            self.round_renewals += sum(1 for res in results.values() if not isinstance(res, GitLeaseError))
            for r in due:
                res = results[r.lease_id]
                if isinstance(res, Busy):  # its holder is renewing or releasing it right now
                    continue
                if isinstance(res, NotHeld):
                    r.state, r.error = "dropped", res.message
                elif isinstance(res, LeaseLost):
                    r.state, r.error = "lost", res.message
                elif isinstance(res, GitLeaseError):
                    r.error = res.message
                    if self.clock.now() >= r.expires - self.margin:
                        r.state = "lost"
                        r.error = f"renewal not confirmed before the deadline: {res.message}"
                else:
                    r.expires, r.version, r.error = res.record.expires, res.record.version, ""
                    if r.progress == sent[r.lease_id]:
                        r.progress = None
        with self.lock:
            live = [r for r in self.regs.values() if r.state == "held"]
        if not live:
            return self.margin
        return max(0.0, min(r.due_at(self.fraction) for r in live) - self.clock.now())

    def _refresh(self, r: Registration) -> None:
        """Expiry and version from the worktree's held state: a holder that renewed by itself moved them."""
        try:
            h = self._service(r.repo, r.remote)._held(r.lease_id)
        except NotHeld as exc:
            r.state, r.error = "dropped", f"{exc.message}; not renewed"
            return
        if h.version > r.version:
            rec = records.parse(h.record.encode("utf-8"))
            r.expires, r.version = rec.expires, rec.version

    def idle_for(self) -> float:
        with self.lock:
            if self.regs:
                return 0.0
        return self.clock.monotonic() - self.idle_since


def _process_alive(pid: int, start: int | None) -> bool:
    from gitlease.core.procs import same_process

    return same_process(pid, start)


# ---------------------------------------------------------------------------- the socket


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def serve(agent: Agent, path: str, *, stop: threading.Event | None = None, rounds: bool = True) -> None:
    """Answer requests and run rounds until idle (or ``stop`` is set, or a ``stop`` request comes). Runs in the
    agent process. ``rounds`` False: no rounds thread (a test ticks the agent itself)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    stop = stop or threading.Event()
    agent.stop_event = stop

    def round_loop():
        while not stop.is_set():
            try:
                wait = agent.tick()
            except Exception as exc:  # a round must never kill the agent: report it on every lease
                with agent.lock:
                    for r in agent.regs.values():
                        r.error = f"agent round failed: {type(exc).__name__}: {exc}"
                wait = 1.0
            if agent.idle_for() >= agent.idle:
                stop.set()
                break
            stop.wait(min(max(wait, 0.05), 1.0))

    if rounds:
        threading.Thread(target=round_loop, daemon=True).start()
    srv.settimeout(0.2)
    try:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_handle, args=(agent, conn), daemon=True).start()
    finally:
        srv.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _handle(agent: Agent, conn: socket.socket) -> None:
    with conn:
        if _peer_uid(conn) != os.getuid():
            return
        f = conn.makefile("rwb")
        for line in f:
            try:
                req = json.loads(line)
                ans = _answer(agent, req)
            except GitLeaseError as exc:
                ans = {"ok": False, "error": exc.message, "kind": exc.kind}
            except (ValueError, KeyError, TypeError) as exc:
                ans = {"ok": False, "error": f"bad request: {exc}", "kind": "usage"}
            f.write((json.dumps(ans) + "\n").encode())
            f.flush()


def _answer(agent: Agent, req: dict) -> dict:
    op = req["op"]
    if op == "ping":
        return {"ok": True, "pid": os.getpid(), "leases": len(agent.regs)}
    if op == "register":
        return dict(
            agent.register(req["repo"], req["lease"], int(req.get("pid") or 0), req.get("remote")).to_json(), ok=True
        )
    if op in ("status", "unregister"):
        reg = agent.status(req["lease"], req.get("progress")) if op == "status" else agent.unregister(req["lease"])
        return dict(reg.to_json(), ok=True) if reg else {"ok": True, "lease": req["lease"], "state": "unknown"}
    if op == "acquire":
        got, reg = agent.acquire(
            req["repo"],
            req.get("remote"),
            list(req["scope"]),
            pid=int(req.get("pid") or 0),
            ttl=req.get("ttl"),
            renew_every=req.get("renewEvery"),
            replace=req.get("replace"),
            who=req.get("who"),
        )
        return dict(
            reg.to_json(),
            ok=True,
            oid=got.oid,
            record=got.record.canonical().decode("utf-8"),
            cleared=list(got.cleared),
        )
    if op == "release":
        agent.release(req["repo"], req.get("remote"), req["lease"], who=req.get("who"))
        return {"ok": True, "lease": req["lease"], "state": "released"}
    if op == "stop":
        if agent.stop_event is not None:
            agent.stop_event.set()
        return {"ok": True}
    raise ValueError(f"unknown op {op!r}")


KINDS = {cls.kind: cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, GitLeaseError)}
KINDS[AgentRefused.kind] = AgentRefused


def raise_refusal(ans: dict) -> None:
    """An agent's ``ok: false`` answer as the error it reports (AgentRefused for the agent's own refusals)."""
    cls = KINDS.get(ans.get("kind") or "", GitLeaseError)
    raise cls(ans.get("error") or "the agent refused")


# ---------------------------------------------------------------------------- the client


class AgentUnreachable(ConnectionError):
    """Nothing answers on the socket: the request was not sent."""


class AgentNoAnswer(ConnectionError):
    """The request was sent but no answer came (timed out, connection closed): it may have been done."""


class AgentClient:
    """What a holder uses. Every call has a short timeout; an agent that does not answer is an agent gone
    (the holder then renews by itself)."""

    def __init__(self, path: str | None = None, *, timeout: float = 2.0) -> None:
        self.path = path or socket_path()
        self.timeout = timeout

    def request(self, op: str, *, timeout: float | None = None, **kw) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout or self.timeout)
            try:
                s.connect(self.path)
            except OSError as exc:
                raise AgentUnreachable(f"no agent on {self.path}: {exc.strerror or exc}") from None
            try:
                s.sendall((json.dumps(dict(op=op, **kw)) + "\n").encode())
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        raise AgentNoAnswer("the agent closed the connection")
                    buf += chunk
            except AgentNoAnswer:
                raise
            except OSError as exc:
                raise AgentNoAnswer(f"no answer from the agent: {exc.strerror or exc}") from None
        try:
            return json.loads(buf)
        except ValueError:
            raise AgentNoAnswer("the agent's answer is not JSON") from None

    def available(self) -> bool:
        try:
            return bool(self.request("ping").get("ok"))
        except (OSError, ValueError):
            return False

    def ensure_running(self, *, idle: float = DEFAULT_IDLE, wait: float = 5.0, clock: Clock = SYSTEM) -> bool:
        """Start the agent in the background if none answers; True once one does."""
        if self.available():
            return True
        env = dict(os.environ, GITLEASE_AGENT_SOCKET=self.path)
        subprocess.Popen(
            [sys.executable, "-m", "gitlease.liveness.agent", "--socket", self.path, "--idle", str(idle)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
        deadline = clock.monotonic() + wait
        while clock.monotonic() < deadline:
            if self.available():
                return True
            clock.sleep(0.05)
        return False


def _open_service(repo: str, remote: str | None):
    from gitlease.service.factory import open_service

    return open_service(repo, remote=remote)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="gitlease.liveness.agent")
    ap.add_argument("--socket", default=None)
    ap.add_argument("--idle", type=float, default=DEFAULT_IDLE)
    ap.add_argument("--fraction", type=float, default=DEFAULT_FRACTION)
    args = ap.parse_args(argv)
    agent = Agent(_open_service, idle=args.idle, fraction=args.fraction)
    serve(agent, args.socket or socket_path())
    return 0


if __name__ == "__main__":
    sys.exit(main())
