"""The per-user, per-host renewal agent (issue 11): local holders register their leases; the agent renews all
of them in one push per store and interval (batch.renew_many) and tells each holder when its lease is lost.

- Adaptive: a round starts when a lease has ``fraction`` of its TTL left (default one half), or reaches its
  declared ``renewEvery``, whichever comes first; the round renews every lease the agent holds, so they all
  share one phase and one push per store per interval.
- Renewal follows the holder, not its pid (issue 17): a lease is renewed only while its holder has checked in
  (polled ``status``, from the registered pid) within its own interval plus a quarter of it (at least 2 s): a
  frozen (SIGSTOP), hung or dead holder stops being renewed, and its lease ends at its recorded stop deadline
  and expiry. Each round also checks every holder's pid and process start time and drops the leases of dead
  holders.
- It signs exactly as the holder would: each holder names its key (and where the key is); the agent renews
  with that key or refuses (the holder then renews by itself), and ``LeaseService.prepare_renewal`` never writes
  a version the owner's key did not sign. What it knows of a repository (its service: configuration, signer) is
  checked against the repository on disk every round and at every request, and dropped when it changed.
- A lease whose renewal cannot be confirmed before ``expires - margin`` is reported lost (stop signal).
- It stops by itself after ``idle`` seconds without a lease it renews (ended registrations of dead holders are
  dropped).
- Piggybacking: an ``acquire`` or ``release`` a local holder makes through the agent carries, in the same
  atomic push, the renewals of the other leases of that store and object store that are due within half their
  renewal interval; if one of those renewals is refused, the acquire or release is retried alone (the refused
  lease is found lost at the next round).

Protocol: one JSON object per line over a unix socket (``socket_path()``: a 0700 folder under
``$XDG_RUNTIME_DIR`` or ``/tmp``), peers must be the same uid. Requests ``{"op": "register", "repo", "lease",
"pid", "remote", "every", "stopAfter", "who"}``, ``{"op": "status", "lease", "progress"}``, ``{"op":
"unregister", "lease"}``, ``{"op": "acquire", "repo", "remote", "scope", "pid", "ttl", "renewEvery",
"stopAfter", "replace", "who"}``, ``{"op": "release", "repo", "remote", "lease", "who"}``, ``{"op": "ping"}``,
``{"op": "stop"}``; every answer has ``ok`` and, for a lease, ``state`` (held | lost | dropped | unknown),
``expiresAt``, ``stopBy``, ``version``, ``error``; a refusal has ``kind`` (errors.py) and ``error``. ``who``:
the holder's ``agent``, ``task``, ``workspace``, ``key`` (its public key) and ``keyRef`` (its key file, or
``key::<public key>`` for a key in ssh-agent).
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
from typing import TYPE_CHECKING

from gitlease.core import errors
from gitlease.core import record as records
from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.errors import Forbidden, GitLeaseError, LeaseLost, NotHeld, UsageError

if TYPE_CHECKING:
    from gitlease.service.leases import LeaseService

DEFAULT_FRACTION = 0.5
DEFAULT_IDLE = 60.0
DEFAULT_MARGIN = 5.0
GATHER = 2.0
PIGGYBACK_WINDOW = 0.5  # a lease rides along when due within this fraction of its renewal interval
CHECKIN_SLACK = 2.0  # a holder's check-in may be this late (or a quarter of its interval, if more)
# what a holder's environment names that is not the agent's (the agent serves every holder on the host)
HOLDER_ENV = ("GITLEASE_AGENT", "GITLEASE_TASK", "GITLEASE_LEASE", "GITLEASE_PROGRESS_FILE", "GITLEASE_RENEW_AGENT")


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
    stop_by: float | None = None  # the current version's stop deadline (None: its expiry)
    every: float | None = None  # how often the holder checks in (its heartbeat's interval)
    stop_after: int | None = None  # the holder's stop horizon, written into each renewal (None: as before)
    who: dict | None = None  # the holder's identity and key (see the module's docstring)
    checked_in: float = 0.0  # monotonic time of the holder's last check-in
    ended: float | None = None  # monotonic time it stopped being held

    def due_at(self, fraction: float) -> float:
        at = self.expires - self.ttl * fraction
        if self.renew_every:
            at = min(at, self.expires - self.ttl + self.renew_every)
        return at

    def interval(self, fraction: float) -> float:
        """Seconds from a renewal to the next one."""
        return self.due_at(fraction) - (self.expires - self.ttl)

    def checkin_bound(self, fraction: float) -> float:
        """How long the holder may be silent and still be renewed."""
        every = self.every or self.renew_every or self.interval(fraction)
        return every + max(CHECKIN_SLACK, every / 4)

    @property
    def stop_deadline(self) -> float:
        return self.expires if self.stop_by is None else self.stop_by

    def end(self, state: str, error: str, at: float) -> None:
        self.state, self.error, self.ended = state, error, at

    def to_json(self) -> dict:
        from gitlease.core.clock import iso

        return {
            "lease": self.lease_id,
            "state": self.state,
            "expiresAt": iso(self.expires),
            "stopBy": iso(self.stop_deadline),
            "version": self.version,
            "error": self.error,
            "repo": self.repo,
            "pid": self.pid,
        }


class Agent:
    """The renewal logic, without the socket: ``tick()`` runs one round. Clock injected."""

    def __init__(
        self,
        open_service: Callable[[str, str | None], LeaseService],
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
        # what the agent knows of each repository: (repo, remote) -> (its identity on disk, its service)
        self.services: dict[tuple[str, str], tuple[tuple, LeaseService]] = {}
        self._checked: set[tuple[str, str]] = set()  # identities checked in this round
        self._keyed: dict[tuple[str, str, str], tuple[LeaseService, LeaseService]] = {}  # holder-key services, by base
        self._signers: dict[str, tuple[object, object]] = {}  # keyRef -> (its file's stamp, signer)
        self.lock = threading.Lock()
        self.busy_at = clock.monotonic()  # the last moment a lease was renewed by this agent (or registered)
        self.pushes = 0  # rounds that renewed something (one push per store and object store each)
        self.piggybacked = 0  # renewals that rode in an acquire's or a release's push
        self.round_renewals = 0  # renewals made by rounds
        self.round_lock = threading.Lock()  # one round, acquire or release at a time
        self.stop_event: threading.Event | None = None

    # ------------------------------------------------------------------ what it knows of repositories
    def _service(self, repo: str, remote: str | None, *, fresh: bool = False):
        """The service of ``repo`` for ``remote``: opened once, and opened again when the repository on disk
        changed (removed and made again, its configuration or signing key edited). Checked once per round, and
        at every request (``fresh``)."""
        key = (repo, remote or "")
        cached = self.services.get(key)
        if cached is not None and not fresh and key in self._checked:
            return cached[1]
        ident = _identity(repo)
        if cached is None or cached[0] != ident:
            cached = self.services[key] = (ident, self.open_service(repo, remote))
        self._checked.add(key)
        return cached[1]

    def _signing_service(self, repo: str, remote: str | None, who: dict | None, *, fresh: bool = False):
        """The service that renews for the holder ``who``: signing with the holder's own key (the repository's
        configured one, or the ``keyRef`` it named), or AgentRefused: never another key."""
        base = self._service(repo, remote, fresh=fresh)
        if not who or "key" not in who:
            return base  # a holder that does not say: prepare_renewal still signs only as the owner
        want = who["key"]
        if base.signer.public_key == want:
            return base
        ref = who.get("keyRef") if want else None
        signer = None
        if ref:
            try:
                signer = self._signer(ref)
            except GitLeaseError as exc:
                raise AgentRefused(f"the agent cannot load the holder's key {ref}: {exc.message}") from None
        elif want is None:
            from gitlease.identity.signer import UNSIGNED

            signer, ref = UNSIGNED, ""
        if signer is None or signer.public_key != want:
            raise AgentRefused("the holder signs with a key the agent cannot sign with: it renews by itself")
        k = (repo, remote or "", ref or "")
        got = self._keyed.get(k)
        if got is None or got[0] is not base or got[1].signer is not signer:
            from gitlease.service.leases import LeaseService

            got = self._keyed[k] = (
                base,
                LeaseService(base.repo, base.settings, store=base.store, clock=base.clock, signer=signer),
            )
        return got[1]

    def _signer(self, ref: str):
        from gitlease.identity.signer import load_signer

        stamp = _file_stamp(ref[len("key::") :] if ref.startswith("key::") else ref)
        cached = self._signers.get(ref)
        if cached is None or cached[0] != stamp:
            cached = self._signers[ref] = (stamp, load_signer(ref))
        return cached[1]

    def _reg_service(self, r: Registration):
        return self._signing_service(r.repo, r.remote, r.who)

    # ------------------------------------------------------------------ requests
    def register(
        self,
        repo: str,
        lease_id: str,
        pid: int,
        remote: str | None = None,
        *,
        every: float | None = None,
        stop_after: int | None = None,
        who: dict | None = None,
    ) -> Registration:
        svc = self._signing_service(repo, remote, who, fresh=True)
        h = svc.held_lease(lease_id)  # NotHeld if that worktree does not hold it
        rec = records.parse(h.record.encode("utf-8"))
        if rec.owner.key != svc.signer.public_key:
            raise AgentRefused(f"lease {lease_id} is signed by another key than the agent would sign with")
        from gitlease.core.procs import process_start

        now = self.clock.monotonic()
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
            stop_by=rec.stop_deadline,
            every=float(every) if every else None,
            stop_after=int(stop_after) if stop_after else None,
            who=who,
            checked_in=now,
        )
        with self.lock:
            self.regs[lease_id] = reg
            self.busy_at = now
        return reg

    def unregister(self, lease_id: str) -> Registration | None:
        with self.lock:
            return self.regs.pop(lease_id, None)

    def status(self, lease_id: str, progress: str | None = None, *, peer: int | None = None) -> Registration | None:
        """A holder's poll: its lease's state, and a check-in (when it comes from the registered holder's pid,
        or from within the agent's own process: ``peer`` None)."""
        with self.lock:
            reg = self.regs.get(lease_id)
            if reg is not None:
                if progress is not None:
                    reg.progress = progress
                if peer is None or not reg.pid or peer == reg.pid:
                    reg.checked_in = self.clock.monotonic()
            return reg

    def _holder_service(self, repo: str, remote: str | None, who: dict | None):
        """The service for ``repo``, with the holder's identity (agent id, task, workspace) and its key."""
        from dataclasses import replace as dc_replace

        from gitlease.service.leases import LeaseService

        base = self._signing_service(repo, remote, who, fresh=True)
        who = who or {}
        changes = {k: who[k] for k in ("agent", "task", "workspace") if who.get(k)}
        if all(getattr(base.settings, k) == v for k, v in changes.items()):
            return base
        return LeaseService(
            base.repo, dc_replace(base.settings, **changes), store=base.store, clock=base.clock, signer=base.signer
        )

    def _fresh(self, r: Registration) -> bool:
        return self.clock.monotonic() - r.checked_in <= r.checkin_bound(self.fraction)

    def _ready_piggyback(self, svc, exclude: set[str]):
        """Prepared renewals of the held leases that share ``svc``'s push and are due soon."""
        from gitlease.liveness import batch

        key = batch.group_key(svc)
        now = self.clock.now()
        with self.lock:
            regs = [r for r in self.regs.values() if r.state == "held" and r.lease_id not in exclude]
        picked = []
        for r in regs:
            try:
                rsvc = self._reg_service(r)
            except GitLeaseError:
                continue  # its round says why
            if batch.group_key(rsvc) != key:
                continue
            soon = r.due_at(self.fraction) - now <= r.interval(self.fraction) * PIGGYBACK_WINDOW
            if soon and self._fresh(r) and (not r.pid or self.alive(r.pid, r.pid_start)):
                picked.append((rsvc, r.lease_id, r.progress, r.stop_after))
        items, _skipped = batch.prepare(picked)  # a lease that cannot be prepared waits for its round
        return items

    def _finish_piggyback(self, items, landed: bool | None) -> None:
        from gitlease.liveness import batch

        done = batch.finish(items, landed)
        with self.lock:
            for it in items:
                reg = self.regs.get(it.lease_id)
                res = done.get(it.lease_id)
                if reg is not None and res is not None and not isinstance(res, GitLeaseError):
                    self._renewed(reg, res)
                    if reg.progress == it.progress:
                        reg.progress = None
        self.piggybacked += sum(1 for res in done.values() if not isinstance(res, GitLeaseError))

    @staticmethod
    def _renewed(reg: Registration, res) -> None:
        reg.expires, reg.version, reg.error = res.record.expires, res.record.version, ""
        reg.stop_by = res.record.stop_deadline

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
        stop_after: int | None = None,
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
                    stop_after=stop_after,
                )
                landed = got.piggybacked
            finally:
                self._finish_piggyback(items, landed)
        reg = self.register(repo, got.lease_id, pid, remote, every=renew_every, stop_after=stop_after, who=who)
        return got, reg

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
        """One round: drop leases of dead holders, skip those whose holders stopped checking in, renew what is
        due (and what is nearly due, to share the push), report losses, forget what has ended. Returns the
        seconds until the next lease is due."""
        with self.round_lock:
            return self._tick()

    def _tick(self) -> float:
        from gitlease.liveness.batch import Busy, renew_many

        self._checked.clear()
        now, started = self.clock.now(), self.clock.monotonic()
        with self.lock:
            held = [r for r in self.regs.values() if r.state == "held"]
        live: list[Registration] = []
        for r in held:
            if r.pid and not self.alive(r.pid, r.pid_start):
                r.end("dropped", f"holder process {r.pid} is gone; not renewed", started)
                continue
            self._refresh(r)
            if r.state != "held":
                continue
            if not self._fresh(r):
                silent = started - r.checked_in
                if now >= r.stop_deadline:
                    r.end(
                        "dropped",
                        f"its holder has not checked in for {silent:.0f}s: not renewed, and its stop deadline passed",
                        started,
                    )
                else:
                    r.error = f"its holder has not checked in for {silent:.0f}s: not renewed until it does"
                continue
            live.append(r)
        # A round renews every lease once one is due (within GATHER), so all leases of this agent share one
        # phase: one push per store per renewal interval, however many leases and whenever they were acquired
        # (a lease acquired since the last round is renewed early, never late).
        due = (
            live
            if any(now + min(GATHER, r.interval(self.fraction) / 4) >= r.due_at(self.fraction) for r in live)
            else []
        )
        if due:
            sent = {r.lease_id: r.progress for r in due}
            items = []
            for r in due:
                try:
                    items.append((self._reg_service(r), r.lease_id, r.progress, r.stop_after))
                except GitLeaseError as exc:  # it can no longer sign as this holder: the holder renews itself
                    r.end("dropped", f"{exc.message}; not renewed by the agent", started)
            results = renew_many(items) if items else {}
            self.pushes += 1 if items else 0
            self.round_renewals += sum(1 for res in results.values() if not isinstance(res, GitLeaseError))
            for r in due:
                res = results.get(r.lease_id)
                if res is None or isinstance(res, Busy):  # not sent, or its holder is renewing it right now
                    continue
                if isinstance(res, NotHeld):
                    r.end("dropped", res.message, started)
                elif isinstance(res, (LeaseLost, Forbidden)):
                    r.end("lost", res.message, started)
                elif isinstance(res, GitLeaseError):
                    r.error = res.message
                    if self.clock.now() >= r.expires - self.margin:
                        r.end("lost", f"renewal not confirmed before the deadline: {res.message}", started)
                else:
                    self._renewed(r, res)
                    if r.progress == sent[r.lease_id]:
                        r.progress = None
        mono = self.clock.monotonic()
        with self.lock:
            for lid, r in list(self.regs.items()):  # ended before this round, and its holder gone or told long ago
                if r.state != "held" and r.ended is not None and r.ended < started:
                    linger = max(float(r.ttl), r.checkin_bound(self.fraction) * 2)
                    if mono - r.ended > linger or (r.pid and not self.alive(r.pid, r.pid_start)):
                        del self.regs[lid]
            live = [r for r in self.regs.values() if r.state == "held"]
            if live:
                self.busy_at = mono
        if not live:
            return self.margin
        return max(0.0, min(r.due_at(self.fraction) for r in live) - self.clock.now())

    def _refresh(self, r: Registration) -> None:
        """Expiry and version from the worktree's held state: a holder that renewed by itself moved them."""
        try:
            h = self._service(r.repo, r.remote).held_lease(r.lease_id)
        except GitLeaseError as exc:  # not held any more, or the worktree itself is gone
            r.end("dropped", f"{exc.message}; not renewed", self.clock.monotonic())
            return
        if h.version > r.version:
            rec = records.parse(h.record.encode("utf-8"))
            r.expires, r.version, r.stop_by = rec.expires, rec.version, rec.stop_deadline

    def idle_for(self) -> float:
        """Seconds since the agent last had a lease to renew (0 while it has one)."""
        with self.lock:
            if any(r.state == "held" for r in self.regs.values()):
                self.busy_at = self.clock.monotonic()
                return 0.0
        return self.clock.monotonic() - self.busy_at


def _identity(repo: str) -> tuple:
    """What the agent's service of ``repo`` depends on: the repository (its git dirs and ``lease.*``
    configuration, read afresh), the git dir's inode (a repository removed and made again at the same path
    is another one), and the signing key file's inode, time and size."""
    from gitlease.core.repo import Repo

    r = Repo.discover(repo)
    st = os.stat(r.git_dir)
    key = r.config.get("lease.signingkey")
    return (r, st.st_dev, st.st_ino, _file_stamp(key) if key and not key.startswith(("key::", "ssh-")) else None)


def _file_stamp(path: str | None) -> tuple[int, int, int] | None:
    if not path:
        return None
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _process_alive(pid: int, start: int | None) -> bool:
    from gitlease.core.procs import same_process

    return same_process(pid, start)


# ---------------------------------------------------------------------------- the socket


def _peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def serve(agent: Agent, path: str, *, stop: threading.Event | None = None, rounds: bool = True) -> None:
    """Answer requests and run rounds until idle (or ``stop`` is set, or a ``stop`` request comes). Runs in the
    agent process. ``rounds`` False: no rounds thread (a test ticks the agent itself)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    if AgentClient(path, timeout=1.0).available():  # one serves already: taking its socket would orphan it
        return
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
        peer, uid = _peer(conn)
        if uid != os.getuid():
            return
        f = conn.makefile("rwb")
        for line in f:
            try:
                req = json.loads(line)
                ans = _answer(agent, req, peer)
            except GitLeaseError as exc:
                ans = {"ok": False, "error": exc.message, "kind": exc.kind}
            except (ValueError, KeyError, TypeError) as exc:
                ans = {"ok": False, "error": f"bad request: {exc}", "kind": "usage"}
            f.write((json.dumps(ans) + "\n").encode())
            f.flush()


def _answer(agent: Agent, req: dict, peer: int | None = None) -> dict:
    op = req["op"]
    if op == "ping":
        with agent.lock:
            held = sum(1 for r in agent.regs.values() if r.state == "held")
        return {"ok": True, "pid": os.getpid(), "leases": held, "registrations": len(agent.regs)}
    if op == "register":
        reg = agent.register(
            req["repo"],
            req["lease"],
            int(req.get("pid") or 0),
            req.get("remote"),
            every=req.get("every"),
            stop_after=req.get("stopAfter"),
            who=req.get("who"),
        )
        return dict(reg.to_json(), ok=True)
    if op in ("status", "unregister"):
        found: Registration | None
        if op == "status":
            found = agent.status(req["lease"], req.get("progress"), peer=peer)
        else:
            found = agent.unregister(req["lease"])
        return dict(found.to_json(), ok=True) if found else {"ok": True, "lease": req["lease"], "state": "unknown"}
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
            stop_after=req.get("stopAfter"),
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
        """Start the agent in the background if none answers; True once one does. Holders starting together
        (a runner's workers, several processes) start ONE: the start is serialised by a lock file beside the
        socket, and whoever gets it second finds the first one's agent answering."""
        if self.available():
            return True
        from gitlease.core.fsutil import LockBusy, lock_file

        self.path = os.path.abspath(self.path)
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        try:
            starting = lock_file(self.path + ".start", wait=wait, clock=clock)
        except LockBusy:  # another holder is starting one and has not finished: it answers, or nothing does
            return self.available()
        with starting:
            return self.available() or self._start(idle, wait, clock)

    def _start(self, idle: float, wait: float, clock: Clock) -> bool:
        env = {k: v for k, v in os.environ.items() if k not in HOLDER_ENV}
        env["GITLEASE_AGENT_SOCKET"] = self.path
        subprocess.Popen(
            [sys.executable, "-m", "gitlease.liveness.agent", "--socket", self.path, "--idle", str(idle)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            close_fds=True,
            cwd="/",  # a daemon keeps no holder's folder as its own (it may be removed while the agent runs)
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
    path = os.path.abspath(args.socket or socket_path())
    os.chdir("/")  # started from a holder's folder, which may be removed: every path it uses is absolute
    agent = Agent(_open_service, idle=args.idle, fraction=args.fraction)
    serve(agent, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
