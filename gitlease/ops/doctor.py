"""``git lease doctor``: find out at set-up time, not in production, whether a remote can host leases.

The remote is probed with throw-away refs under ``refs/leases/doctor/<run>/`` (``<run>`` is a UTC timestamp and
a random suffix), each probe testing one property the protocol (docs/protocol.md) rests on:

* ``custom-refs``: a push creating refs under ``refs/leases/`` is accepted, and ``ls-remote`` lists them;
* ``atomic-advertised``: ``atomic`` is in receive-pack's capability advertisement (read from the packet
  trace, ``GIT_TRACE_PACKET``, of that first push: the advertisement is what the git client itself reads);
* ``atomic-honoured``: an ``--atomic`` push of two refs, one of which the server must refuse (a directory/file
  conflict), leaves neither;
* ``compare-and-swap``: an update whose expected old value went stale *after* the client read the
  advertisement is refused by the server. Made deterministic with a ``pre-push`` hook (our own, through
  ``-c core.hooksPath`` pointing at a private folder) that moves the ref in between: git runs pre-push after
  its own ``--force-with-lease`` check and before it sends the update, so only the server can catch it;
* ``dir-file``: creating ``X/sub`` while ``X`` exists, and ``Y`` while ``Y/leaf`` exists, are both refused;
* ``deletes``: each probe ref can be deleted, pinned to its value (that is also the clean-up);
* ``latency``: the round trip of a read (``ls-remote``) and of a push.

Local checks: git version, hooks installed and reachable from every linked worktree, signing key readable,
trust file on the remote's default branch, clock offset against the remote (from the HTTP ``Date:`` header
over http(s); other transports carry no clock).

The probe refs are deleted in a ``finally`` (also on failure and on interrupt); refs of an earlier run that
was killed before it could clean up are deleted by the next run once they are older than ``STALE_AFTER``.
Every push is built by ``store.push_argv`` (pinned, never forced). Library code: it reports, the CLI prints.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gitlease.core import gitcmd, gitq
from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.config import Settings
from gitlease.core.errors import DoctorFailed, GitLeaseError, RemoteUnavailable
from gitlease.core.hookgit import RESERVED
from gitlease.core.objects import PROBE_FILE, PROBE_MAGIC, ObjectWriter
from gitlease.core.refnames import NAMESPACE
from gitlease.core.repo import Repo
from gitlease.core.store import (
    Outcome,
    RefUpdate,
    RemoteStore,
    Store,
    _last_error,
    open_store,
    parse_push_porcelain,
)
from gitlease.ops import race

# A probe ref spelled with every character gitlease puts in ref names: ".github/work flows" and "user@host"
# encoded (core/refnames.py), and the plain characters around them.
NAME_PROBE = "names/+2Egithub/work+20flows/AZaz09-_.x+2B/user+40host"
NAME_ALPHABET = "A-Z a-z 0-9 - _ . + /"
NESTED_PUSH = 10  # seconds: the compare-and-swap probe's second push, made while its first is connected
DOCTOR_PREFIX = RESERVED[0]  # store.list_refs skips it: probes never block a lease
STALE_AFTER = 900  # seconds: a doctor run's refs older than this are leftovers of a run that was killed
# The newest git features gitlease relies on: worktree list -z (2.36), rev-parse --path-format (2.31),
# fetch --stdin and --no-write-fetch-head (2.29), update-ref --stdin start/prepare/commit (2.28).
MIN_GIT = (2, 36)
TESTED_GIT = (2, 39)
HOOK_NAMES = ("pre-commit", "pre-push")
HOOK_MARKERS = ("gitlease", "git-lease", "git lease")

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"

# One advertised ref line in a packet trace, as the client read it ("<"): "<oid> <ref>\0<capabilities>".
_ADVERTISEMENT = re.compile(r"packet:\s+[\w.-]+< (?:[0-9a-f]{40}|[0-9a-f]{64}) [^ \\]+\\0(.*)$")
_DATE_HEADER = re.compile(r"<= Recv header: Date: (.+?)\s*$", re.IGNORECASE)
_RUN_NAME = re.compile(r"^(\d{8}T\d{6}Z)-[0-9a-f]+$")


@dataclass
class Check:
    """One line of the report: ``status`` is pass, fail (leases cannot safely work), warn (works, but fix it)
    or skip (not applicable, or not testable after an earlier failure)."""

    name: str
    status: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "message": self.message, **self.data}

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<17}  {self.message}"


@dataclass
class Report:
    store: str  # the remote as given, or "local"
    url: str | None
    run: str  # the run's ref folder
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return not any(c.status == FAIL for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "store": self.store,
            "url": self.url,
            "probeRefs": self.run,
            "checks": [c.to_json() for c in self.checks],
        }


# ------------------------------------------------------------------------------- pure helpers


def parse_git_version(text: str) -> tuple[int, ...] | None:
    """``git version 2.39.5`` (also ``2.39.5.windows.1``, ``2.39.5 (Apple Git-143)``) -> (2, 39, 5)."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def advertised_capabilities(trace: str) -> list[str] | None:
    """The capabilities of the first ref advertisement the client read, from a ``GIT_TRACE_PACKET`` log;
    None when the trace holds none (the connection failed, or a transport we cannot see through)."""
    for line in trace.splitlines():
        m = _ADVERTISEMENT.search(line)
        if m:
            return m.group(1).split()
    return None


def http_date_offset(trace: str, sent: float, received: float) -> tuple[float, float] | None:
    """(offset, uncertainty) in seconds of the server's clock against ours, from the last ``Date:`` header
    in a ``GIT_TRACE_CURL`` log of a request made between ``sent`` and ``received`` (our wall clock). The
    header has one-second resolution: the server's time was in [D, D+1)."""
    from email.utils import parsedate_to_datetime

    dates = [m.group(1) for m in map(_DATE_HEADER.search, trace.splitlines()) if m]
    if not dates:
        return None
    try:
        server = parsedate_to_datetime(dates[-1]).timestamp()
    except (TypeError, ValueError):
        return None
    middle = (sent + received) / 2
    return server + 0.5 - middle, 0.5 + (received - sent) / 2


def run_name(now: float, nonce: str) -> str:
    return datetime.fromtimestamp(int(now), tz=UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + nonce


def run_started(name: str) -> float | None:
    m = _RUN_NAME.match(name)
    if not m:
        return None
    return datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()


def is_gitlease_hook(text: str) -> bool:
    low = text.lower()
    return any(marker in low for marker in HOOK_MARKERS)


# ------------------------------------------------------------------------------------- doctor


class Doctor:
    """Runs the checks in order, handing each to ``on_check`` as it completes (the CLI prints it)."""

    def __init__(
        self,
        repo: Repo,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
        on_check: Callable[[Check], None] | None = None,
        rounds: int = race.ROUNDS,
    ) -> None:
        self.repo = repo
        self.rounds = rounds
        self.race: race.RaceResult | None = None
        self.settings = settings
        self.clock = clock
        self.on_check = on_check or (lambda c: None)
        self.store: Store = open_store(repo.cwd, settings.remote, timeout=settings.timeout)
        self.remote = settings.remote
        self.objects = ObjectWriter(repo.objects_dir, repo.object_format)
        self.checks: list[Check] = []
        self.run = DOCTOR_PREFIX + run_name(clock.now(), secrets.token_hex(4))
        self.url: str | None = None
        self._tmp: str | None = None
        self._atomic = True  # until the advertisement says otherwise
        self._serial = False  # the server answers one connection at a time (the compare-and-swap probe saw it)
        self._leftovers = 0
        self._caps: list[str] | None = None  # receive-pack's capability advertisement, once read
        self._cas_old = ""
        self._push_ms = self._read_ms = 0.0

    @property
    def _remote(self) -> str:
        """The remote's name, for the checks that run only against a remote store."""
        if self.remote is None:
            raise AssertionError("a remote-store check ran against the local store")
        return self.remote

    # -- reporting
    def _add(self, name: str, status: str, message: str, **data: Any) -> Check:
        check = Check(name, status, message, data)
        self.checks.append(check)
        self.on_check(check)
        return check

    def _warn_if(self, name: str, bad: bool, message: str, why: str, **data: Any) -> Check:
        """``name`` passes with ``message``; or, when ``bad``, warns with ``message`` and ``why``."""
        return self._add(name, WARN if bad else PASS, message + why if bad else message, **data)

    def _status(self, name: str) -> str | None:
        for c in self.checks:
            if c.name == name:
                return c.status
        return None

    # -- the whole run
    def diagnose(self) -> Report:
        self.check_git_version()
        if self.remote is not None:
            self.url = self._resolve_url()
        self._tmp = tempfile.mkdtemp(prefix="gitlease-doctor-")
        try:
            self.probe_store()
            self.record_verdict()
            self.check_trust_file()
            self.check_clock()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self.check_hooks()
        self.check_signing_key()
        return Report(self.store.name, self.url, self.run, self.checks)

    # ------------------------------------------------------------------------- local: git itself
    def check_git_version(self) -> None:
        said = gitq.version()
        version = parse_git_version(said)
        shown = ".".join(map(str, version)) if version else said.strip() or "unknown"
        need = ".".join(map(str, MIN_GIT))
        if version is None or version[:2] < MIN_GIT:
            self._add("git-version", FAIL, f"git {shown}: gitlease needs git {need} or newer", version=shown)
        elif version[:2] < TESTED_GIT:
            self._add(
                "git-version",
                WARN,
                f"git {shown}: works from {need}, tested on {'.'.join(map(str, TESTED_GIT))}",
                version=shown,
            )
        else:
            self._add("git-version", PASS, f"git {shown} (gitlease needs {need} or newer)", version=shown)

    def _resolve_url(self) -> str:
        return gitq.resolved_url(self.repo.cwd, self._remote)

    # ------------------------------------------------------------------------- the store probes
    PROBES = (
        "custom-refs",
        "ref-names",
        "atomic-advertised",
        "dir-file",
        "atomic-honoured",
        "compare-and-swap",
        "concurrency",
        "latency",
    )

    def probe_store(self) -> None:
        try:
            self._remove_leftovers()
            self._probe()
        except RemoteUnavailable as exc:
            self._add("remote", FAIL, f"the remote stopped answering during the probes: {exc}")
            self._skip_probes("the remote stopped answering")
        finally:
            self._cleanup()

    def _skip_probes(self, reason: str) -> None:
        for name in self.PROBES:
            if self._status(name) is None:
                self._add(name, SKIP, f"not tested: {reason}")

    def _commit(self, label: str, parent: str | None = None) -> str:
        """A fresh, unique commit for a probe ref (unique objects: see the same-object trap in git-facts);
        ``parent``: a fast-forward of that probe commit (as a renewal is of the version before)."""
        body = PROBE_MAGIC + f"{label}\nrun: {self.run}\nnonce: {secrets.token_hex(8)}\n".encode()
        tree = self.objects.tree({PROBE_FILE: self.objects.blob(body)})
        return self.objects.commit(
            tree,
            (parent,) if parent else (),
            "gitlease doctor <doctor@gitlease.invalid>",
            int(self.clock.now()),
            f"gitlease doctor probe {label}",
        )

    def _ref(self, name: str) -> str:
        return f"{self.run}/{name}"

    def _list(self, pattern: str) -> dict[str, str]:
        """Refs matching ``pattern`` on the store, read now (raises RemoteUnavailable)."""
        if isinstance(self.store, RemoteStore):
            try:
                listed = gitq.ls_remote(
                    self.repo.cwd, self._remote, pattern, refs_only=True, timeout=self.settings.timeout
                )
            except gitcmd.Timeout as exc:
                raise RemoteUnavailable(str(exc)) from None
            if not listed.ok:
                raise RemoteUnavailable(_last_error(listed.err) or f"git ls-remote exit {listed.returncode}")
            return listed.refs
        return gitq.refs(self.repo.cwd, pattern[:-1] if pattern.endswith("*") else pattern, check=True)

    def _push(
        self,
        updates: Sequence[RefUpdate],
        *,
        atomic: bool,
        env: dict[str, str] | None = None,
        hooks_dir: str | None = None,
    ) -> Outcome:
        """A push built by ``push_argv`` with a trace environment or our own hooks folder (the store's
        ``apply`` takes neither). The remote store only."""
        try:
            res = gitq.push(
                self.repo.cwd,
                self._remote,
                updates,
                atomic=atomic,
                hooks_dir=hooks_dir,
                env=env,
                timeout=self.settings.timeout,
            )
        except gitcmd.Timeout as exc:
            return Outcome(ok=False, ambiguous=True, message=str(exc))
        statuses = parse_push_porcelain(res.out)
        if not statuses or any(u.ref not in statuses for u in updates):
            return Outcome(ok=False, ambiguous=True, statuses=statuses, message=_last_error(res.err))
        ok = res.returncode == 0 and all(not s.startswith("rejected") for s in statuses.values())
        return Outcome(ok=ok, statuses=statuses, message="" if ok else _last_error(res.err))

    def _apply_each(self, updates: Sequence[RefUpdate]) -> Outcome:
        """Each update on its own (a non-atomic push; one transaction each on the local store)."""
        if isinstance(self.store, RemoteStore):
            return self.store.apply(updates, atomic=False)
        statuses: dict[str, str] = {}
        for u in updates:
            statuses.update(self.store.apply([u]).statuses)
        return Outcome(ok=all(s == "ok" for s in statuses.values()), statuses=statuses)

    def _probe(self) -> None:
        """The store probes in order; each is a method of its own. A probe that makes the rest meaningless
        (the remote cannot be reached, custom refs are refused) skips them."""
        if not self._probe_custom_refs():
            return
        self._probe_ref_names()
        self._probe_atomic_advertised()
        df_ok = self._probe_dir_file()
        self._probe_atomic_honoured(df_ok)
        self._probe_cas(self._cas_old, self._atomic)
        self._probe_concurrency()
        self._probe_latency()

    def _probe_custom_refs(self) -> bool:
        """1. custom refs accepted (non-atomic: we do not know yet whether the remote does atomic); reads the
        capability advertisement from the packet trace of that push. False: the other probes are skipped."""
        remote = isinstance(self.store, RemoteStore)
        x = {n: self._commit(n) for n in ("probe", "df", "dir-leaf", "cas")}
        self._cas_old = x["cas"]
        created = {
            self._ref("probe"): x["probe"],
            self._ref("df"): x["df"],
            self._ref("dir/leaf"): x["dir-leaf"],
            self._ref("cas"): x["cas"],
        }
        first = [RefUpdate(ref, oid, None) for ref, oid in created.items()]
        t0 = self.clock.monotonic()
        if remote:
            trace = os.path.join(self._tmp or ".", "packet.trace")
            out = self._push(first, atomic=False, env={"GIT_TRACE_PACKET": trace})
            try:
                with open(trace, encoding="utf-8", errors="replace") as fh:
                    self._caps = advertised_capabilities(fh.read())
            except OSError:
                self._caps = None
        else:
            out = self.store.apply(first)
        self._push_ms = (self.clock.monotonic() - t0) * 1000
        if out.ambiguous and not out.statuses:
            self._add("custom-refs", FAIL, f"cannot push to {self.store.name}: {out.message or 'no answer'}")
            self._skip_probes("the remote could not be reached")
            return False
        refused = {r: s for r, s in out.statuses.items() if s != "ok"}
        try:
            t1 = self.clock.monotonic()
            listed = self._list(self.run + "/*")
            self._read_ms = (self.clock.monotonic() - t1) * 1000
        except RemoteUnavailable as exc:
            self._add("custom-refs", FAIL, f"pushed, but cannot list refs: {exc}")
            self._skip_probes("the remote could not be read")
            return False
        missing = [r for r in created if listed.get(r) != created[r]]
        if refused or missing:
            why = next(iter(refused.values()), "rejected").split(":", 1)[-1] if refused else "not listed"
            self._add(
                "custom-refs",
                FAIL,
                f"refs under {NAMESPACE}/ are refused or hidden ({why}): "
                "use another remote (lease.remote) or allow the namespace",
                refused=refused,
                missing=missing,
            )
            self._skip_probes("custom refs are refused")
            return False
        self._add(
            "custom-refs",
            PASS,
            f"refs under {NAMESPACE}/ can be created and are listed" + self._server_said(),
            refs=len(created),
            agent=self.agent,
        )
        return True

    def _probe_ref_names(self) -> None:
        """1b. a ref spelled with every character gitlease writes in ref names (core/refnames.py): letters,
        digits, ``-``, ``_``, inner dots, ``+`` (the escape, also first in a component) and ``/``."""
        ref = self._ref(NAME_PROBE)
        out = self._apply_each([RefUpdate(ref, self._commit("ref-names"), None)])
        if out.ok and ref in self._list(ref):
            self._add("ref-names", PASS, f"ref names of gitlease's whole alphabet are accepted ({NAME_ALPHABET})")
        elif out.ambiguous:
            self._add("ref-names", WARN, f"could not tell: {out.message or 'no verdict'}")
        else:
            said = "; ".join(out.server[:3]) or out.message or "refused"
            self._add(
                "ref-names",
                FAIL,
                f"the server refuses ref names gitlease writes ({said}): scopes, task ids and agent ids that "
                f"need an escape ({NAME_ALPHABET}) could not be leased, released or audited",
                ref=ref,
            )

    @property
    def agent(self) -> str | None:
        """The server's agent string (``agent=...`` in its capability advertisement), e.g. git/2.39.5."""
        for cap in self._caps or ():
            if cap.startswith("agent="):
                return cap[len("agent=") :]
        return None

    def _server_said(self) -> str:
        if self._caps is None:
            return ""
        return f" (server: {self.agent})" if self.agent else " (server: no agent advertised)"

    def _probe_atomic_advertised(self) -> None:
        """2. ``atomic`` in receive-pack's capability advertisement."""
        caps = self._caps
        if not isinstance(self.store, RemoteStore):
            self._add("atomic-advertised", PASS, "local store: update-ref transactions are all-or-nothing")
        elif caps is None:
            self._add(
                "atomic-advertised",
                WARN,
                "could not read the capability advertisement from the packet "
                "trace; the next check tries an --atomic push",
            )
        elif "atomic" in caps:
            self._add("atomic-advertised", PASS, "receive-pack advertises 'atomic'", capabilities=caps)
        else:
            self._atomic = False
            self._add(
                "atomic-advertised",
                FAIL,
                "receive-pack does not advertise 'atomic': every lease write "
                "is an --atomic push (on your own server: receive.advertiseAtomic=true)",
                capabilities=caps,
            )

    def _probe_dir_file(self) -> bool:
        """3. directory/file rule, both directions, each ref on its own. True when it holds."""
        sub, parent = self._ref("df/sub"), self._ref("dir")
        out = self._apply_each(
            [RefUpdate(sub, self._commit("df-sub"), None), RefUpdate(parent, self._commit("dir"), None)]
        )
        after = self._list(self.run + "/*")
        wrong = [r for r in (sub, parent) if r in after]
        df_ok = not wrong and not out.ambiguous
        if df_ok:
            self._add(
                "dir-file", PASS, "an overlapping create is refused (X/sub while X exists, and X while X/leaf exists)"
            )
        elif out.ambiguous and not wrong:
            self._add("dir-file", WARN, f"could not tell: {out.message or 'no verdict'}")
        else:
            self._add(
                "dir-file",
                FAIL,
                "the server accepted an overlapping ref ("
                + ", ".join(r[len(self.run) + 1 :] for r in wrong)
                + "): overlapping leases would not be "
                "refused",
                accepted=wrong,
            )
        return df_ok

    def _probe_atomic_honoured(self, df_ok: bool) -> None:
        """4. one good create + one create the server must refuse (D/F), atomically: neither may land."""
        if not self._atomic:
            self._add("atomic-honoured", SKIP, "not tested: 'atomic' is not advertised")
            return
        if not df_ok:
            self._add("atomic-honoured", SKIP, "not tested: needs the directory/file rule to force a refusal")
            return
        good, bad = self._ref("atomic"), self._ref("df/sub2")
        ups = [RefUpdate(good, self._commit("atomic"), None), RefUpdate(bad, self._commit("df-sub2"), None)]
        out = self.store.apply(ups, atomic=True)
        after = self._list(self.run + "/*")
        if good not in after and bad not in after and not out.ok:
            self._add("atomic-honoured", PASS, "an atomic push with one refused ref left neither ref")
        elif out.ambiguous and good not in after:
            self._add("atomic-honoured", WARN, f"could not tell: {out.message or 'no verdict'}")
        else:
            self._add(
                "atomic-honoured",
                FAIL,
                "an atomic push with one refused ref still wrote "
                + ", ".join(r[len(self.run) + 1 :] for r in (good, bad) if r in after)
                + ": lease writes would not be all-or-nothing",
            )

    def _probe_concurrency(self) -> None:
        """6. pushers racing as acquires do, in rounds of the shapes that trigger the known races, released
        together (gitlease/ops/race.py); the verdict states what the clean rounds rule out."""
        if not self._atomic:
            self._add("concurrency", SKIP, "not tested: 'atomic' is not advertised")
            return
        remote = isinstance(self.store, RemoteStore)
        # (a server that answers one connection at a time cannot be raced: its pushers go one after another)
        gate = race.Gate(self._tmp or tempfile.gettempdir()) if remote and not self._serial else None

        def push(updates: Sequence[RefUpdate], env: dict[str, str] | None, hooks: str | None) -> Outcome:
            if remote:
                return self._push(updates, atomic=True, env=env, hooks_dir=hooks)
            return self.store.apply(updates)

        try:
            got = race.run_probe(
                self._ref("race"),
                push,
                self._list,
                self._commit,
                rounds=self.rounds,
                gate=gate,
                wait=float(self.settings.timeout),
            )
        finally:
            if gate is not None:
                gate.close()
        self.race = got
        cause = (
            "a directory/file race in git's files backend"
            if (self.agent or "").startswith("git/")
            else "the server applied a refused push in part"
        )
        left = (
            f"; refused pushes left part of their refs {got.remnants} time{'s' if got.remnants != 1 else ''} "
            f"({cause}: an acquire deletes such remnants)"
            if got.remnants
            else ""
        )
        data = {"agent": self.agent, **got.to_json()}
        if got.problems:
            self._add(
                "concurrency",
                FAIL,
                f"{got.what()}: {'; '.join(got.problems)}{self._server_said()}: this server grants overlapping "
                "leases when pushes race (JGit/Gerrit: use reftable, docs/hosts.md)",
                **data,
            )
        else:
            self._add(
                "concurrency",
                PASS,
                f"{got.what()}: one winner every round; {got.summary()}{self._server_said()}{left}",
                **data,
            )

    def _probe_latency(self) -> None:
        """7. the round trips of the first push and read."""
        ttl = self.settings.ttl
        read_ms, push_ms = self._read_ms, self._push_ms
        remote = isinstance(self.store, RemoteStore)
        msg = f"read {read_ms:.0f} ms, {'push' if remote else 'write'} {push_ms:.0f} ms"
        self._warn_if(
            "latency",
            push_ms > ttl * 100,  # more than a tenth of the TTL
            msg,
            f": slow against lease.ttl={ttl}s (renewals may not land in time)",
            readMs=round(read_ms, 1),
            pushMs=round(push_ms, 1),
        )

    def _probe_cas(self, old: str, atomic: bool) -> None:
        ref = self._ref("cas")
        # both fast-forwards of the old value, as renewals are: a host that lets pushers create, fast-forward
        # and delete refs, but not rewind them (gitolite's RW without +), can host leases
        mine, theirs = self._commit("cas-mine", old), self._commit("cas-theirs", old)
        if not isinstance(self.store, RemoteStore):
            self.store.apply([RefUpdate(ref, theirs, old)])
            out = self.store.apply([RefUpdate(ref, mine, old)])
            now = self._list(ref).get(ref)
            if not out.ok and now == theirs:
                self._add("compare-and-swap", PASS, "an update expecting a stale value is refused")
            else:
                self._add("compare-and-swap", FAIL, "an update expecting a stale value was not refused")
            return
        out, moved = self._push_moved_under(ref, mine, theirs, old, atomic)
        now = self._list(ref).get(ref)
        if moved != "moved":
            self._cas_client_side(ref, atomic, moved)
        elif not out.ok and now == theirs:
            self._add(
                "compare-and-swap",
                PASS,
                "the server refused an update whose expected value went stale after the client read it",
            )
        elif out.ambiguous and now == theirs:
            self._add("compare-and-swap", WARN, f"could not tell: {out.message or 'no verdict'}")
        else:
            self._add(
                "compare-and-swap",
                FAIL,
                "the server accepted an update whose expected value was stale: two holders could both win a lease",
            )

    def _push_moved_under(self, ref: str, mine: str, theirs: str, old: str, atomic: bool) -> tuple[Outcome, str]:
        """Push ``old -> mine`` while, between git's own lease check and the update, another push moves the ref
        ``old -> theirs``: our push waits at a gate in its pre-push hook (after it read the advertisement, before
        it sends the update) while this process makes the other push. Returns our outcome and ``moved``, or
        ``serial`` (the other push got no answer while ours was connected: a server that serves one connection
        at a time), or ``refused`` / ``no-hook`` (our hook did not run)."""
        gate = race.Gate(self._tmp or tempfile.gettempdir())
        got: dict[str, Outcome] = {}
        moved = ["no-hook"]
        wait = float(self.settings.timeout)

        def ours() -> None:
            got["out"] = self._push(
                [RefUpdate(ref, mine, old)], atomic=atomic, env=gate.env(wait), hooks_dir=gate.hooks_dir
            )

        def move() -> None:
            other = self.store.apply([RefUpdate(ref, theirs, old)], atomic=atomic, timeout=min(wait, NESTED_PUSH))
            serial = other.ambiguous and other.connected
            moved[0] = "moved" if other.ok else "serial" if serial else f"refused: {other.message or 'no reason given'}"

        thread = threading.Thread(target=ours, daemon=True)
        thread.start()
        try:
            gate.open_when_all_wait(1, [thread], wait, before_release=move)
            gate.drain([thread])
            thread.join()
        finally:
            gate.close()
        return got.get("out", Outcome(ok=False, ambiguous=True, message="not run")), moved[0]

    def _cas_client_side(self, ref: str, atomic: bool, why: str) -> None:
        """The compare-and-swap check when the server-side one could not be made (``why``: serial, refused:
        REASON, no-hook): a plain stale expectation, checked by the client against the advertisement (and by
        the server). Every move is a fast-forward."""
        current = self._list(ref).get(ref)
        theirs = self._commit("cas-theirs-2", current)
        moved = self.store.apply([RefUpdate(ref, theirs, current)], atomic=atomic)
        if not moved.ok:
            self._add(
                "compare-and-swap",
                WARN,
                f"could not be tested: the server refused a fast-forward of a probe ref ({moved.message or 'refused'})",
            )
            return
        out = self.store.apply([RefUpdate(ref, self._commit("cas-mine-2", current), current)], atomic=atomic)
        now = self._list(ref).get(ref)
        if out.ok or now != theirs:
            self._add("compare-and-swap", FAIL, "an update expecting a stale value was not refused")
        elif why == "serial":
            self._serial = True
            self._add(
                "compare-and-swap",
                WARN,
                f"the server answers one connection at a time (a second push got no answer within {NESTED_PUSH} s "
                "while one was open), so a ref cannot change between a client's read and its update there; "
                "a stale expectation is refused by the client (the server's own check could not be tested)",
            )
        else:
            second = f"refused: {why[len('refused: ') :]}" if why.startswith("refused") else "not made: no hook ran"
            self._add(
                "compare-and-swap",
                WARN,
                "a stale expectation is refused, but only the client-side check could be tested (the probe's "
                f"second push, made while the first waited, was {second})",
            )

    # ------------------------------------------------------------------------------- clean-up
    def _delete(self, refs: dict[str, str]) -> Outcome:
        """Delete ``refs``, each pinned to its value: one atomic push when the remote does atomic (as a
        release does), else each on its own."""
        ups = [RefUpdate(ref, None, oid) for ref, oid in sorted(refs.items())]
        if self._atomic:
            return self.store.apply(ups, atomic=True)
        return self._apply_each(ups)

    def _remove_leftovers(self) -> None:
        """Delete the refs of earlier runs that were killed before their clean-up (older than STALE_AFTER)."""
        try:
            refs = self._list(DOCTOR_PREFIX + "*")
        except RemoteUnavailable:
            return  # the probes report it
        now = self.clock.now()
        stale = {}
        for ref, oid in refs.items():
            started = run_started(ref[len(DOCTOR_PREFIX) :].split("/", 1)[0])
            if started is None or now - started > STALE_AFTER:
                stale[ref] = oid
        if stale:
            out = self._apply_each([RefUpdate(r, None, o) for r, o in sorted(stale.items())])
            self._leftovers = sum(1 for s in out.statuses.values() if s == "ok")

    def _cleanup(self) -> None:
        """Delete this run's refs. Runs in a ``finally`` (also after a failure or an interrupt); an interrupt
        that arrives during the clean-up is held back until it is done (each git call has its timeout)."""
        interrupted: list[int] = []
        old = None
        if threading.current_thread() is threading.main_thread():
            old = signal.signal(signal.SIGINT, lambda *a: interrupted.append(1))
        try:
            self._cleanup_refs()
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)
        if interrupted:
            raise KeyboardInterrupt

    def _cleanup_refs(self) -> None:
        tested = self._status("custom-refs") == PASS
        try:
            refs = self._list(self.run + "/*")
            out = self._delete(refs) if refs else Outcome(ok=True)
            left = self._list(self.run + "/*")
        except RemoteUnavailable as exc:
            self._add(
                "cleanup",
                FAIL,
                f"could not remove the probe refs under {self.run}/ ({exc}); the next "
                f"doctor run removes them once they are {STALE_AFTER // 60} minutes old",
            )
            return
        if tested:
            if not left and out.ok:
                self._add("deletes", PASS, f"{len(refs)} probe refs deleted, each pinned to its value")
            else:
                self._add(
                    "deletes",
                    FAIL,
                    f"{len(left)} of {len(refs)} probe refs could not be deleted "
                    f"({'; '.join(out.server[:2]) or out.message or 'refused'}): leases could not be released",
                    left=sorted(left),
                )
        extra = f"; removed {self._leftovers} left by an interrupted earlier run" if self._leftovers else ""
        if left:
            self._add(
                "cleanup",
                FAIL,
                f"{len(left)} probe refs left; remove them by hand: " + " ".join(sorted(left)) + extra,
                left=sorted(left),
            )
        else:
            self._add(
                "cleanup", PASS, f"no probe refs left on {self.store.name}" + extra, removedLeftovers=self._leftovers
            )

    # ------------------------------------------------------------------------------- the verdict
    SERVER_CHECKS = (*PROBES, "remote", "deletes", "cleanup")

    def record_verdict(self) -> None:
        """Keep what the store probes found on the store (gitlease/service/verdict.py), signed by this clone's
        key: ``acquire`` reads it. Nothing to record for the local store, nor where nothing could be written."""
        if not isinstance(self.store, RemoteStore) or self._status("custom-refs") != PASS:
            return
        from gitlease.service.factory import signer_for
        from gitlease.service.leases import LeaseService
        from gitlease.service.verdict import record

        server = [c for c in self.checks if c.name in self.SERVER_CHECKS]
        report = {"ok": not any(c.status == FAIL for c in server), "checks": [c.to_json() for c in server]}
        identity: dict[str, Any] = {"agent": self.agent, "capabilities": self._caps}
        if self.race is not None:
            identity.update(rounds=self.race.rounds, pushers=self.race.pushers, detectableRate=self.race.bound)
        svc = LeaseService(
            self.repo, self.settings, store=self.store, clock=self.clock, signer=signer_for(self.settings)
        )
        try:
            ref = record(svc, report, identity)
        except GitLeaseError as exc:
            self._add("verdict", WARN, f"not recorded on the store ({exc}): acquires will warn that none is there")
            return
        said = "passed" if report["ok"] else "failed"
        by = f"signed by {self.settings.agent}" if svc.signer.public_key else "unsigned"
        self._add("verdict", PASS, f"kept on the store ({said}, {by}): {ref}", ref=ref, passed=report["ok"])

    # --------------------------------------------------------------------------- trust file, clock
    def check_trust_file(self) -> None:
        path = self.settings.allowed_signers
        if isinstance(self.store, RemoteStore):
            try:
                listed = gitq.ls_remote(self.repo.cwd, self._remote, "HEAD", symref=True, timeout=self.settings.timeout)
            except gitcmd.Timeout:
                self._add("trust-file", WARN, "could not read the remote's default branch (timeout)")
                return
            branch, oid = listed.symrefs.get("HEAD"), listed.refs.get("HEAD")
            where = f"the remote's default branch ({(branch or 'HEAD').removeprefix('refs/heads/')})"
            if oid is None:
                self._add(
                    "trust-file",
                    WARN,
                    f"the remote has no default branch, so no trust file ({path}): leases stay unsigned",
                )
                return
            try:
                self.store.ensure_objects([oid])
            except GitLeaseError as exc:
                self._add("trust-file", WARN, f"could not fetch {where}: {exc}")
                return
        else:
            oid, where = "HEAD", "HEAD"
        from gitlease.identity.trust import describe_files, read_trust_files

        files = read_trust_files(oid, path, cwd=self.repo.cwd)  # the trust file and the signer files beside it
        if not files:
            signed = (
                " (lease.signingKey is set: signed leases cannot be verified)"
                if self.settings.signing_key
                else ": leases stay unsigned"
            )
            self._add("trust-file", WARN, f"no trust file {path} on {where}{signed}", path=path)
            return
        entries = [
            ln
            for _, data in files
            for ln in data.decode("utf-8", "replace").splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")
        ]
        self._add(
            "trust-file",
            PASS,
            f"{describe_files(path, files)} found on {where} ({len(entries)} signers)",
            path=path,
            signers=len(entries),
        )

    def check_clock(self) -> None:
        if not isinstance(self.store, RemoteStore):
            self._add("clock", SKIP, "local store: one machine, one clock")
            return
        url = self.url or self._remote
        if not url.startswith(("http://", "https://")):
            local = "://" not in url and ":" not in url.split("/", 1)[0]
            scheme = url.split("://", 1)[0] + "://" if "://" in url else "a local path" if local else "ssh"
            self._add(
                "clock",
                SKIP,
                f"cannot be told over {scheme} (no clock in the protocol); keep clocks in "
                f"sync with NTP (lease.skew={self.settings.skew}s)",
            )
            return
        trace = os.path.join(self._tmp or ".", "curl.trace")
        env = {"GIT_TRACE_CURL": trace, "GIT_TRACE_CURL_NO_DATA": "1", "GIT_TRACE_REDACT": "1"}
        sent = self.clock.now()
        try:
            gitq.ls_remote(
                self.repo.cwd, self._remote, self.run + "/*", refs_only=True, timeout=self.settings.timeout, env=env
            )
        except gitcmd.Timeout:
            self._add("clock", WARN, "could not be told: the remote did not answer")
            return
        received = self.clock.now()
        try:
            with open(trace, encoding="utf-8", errors="replace") as fh:
                got = http_date_offset(fh.read(), sent, received)
        except OSError:
            got = None
        if got is None:
            self._add("clock", SKIP, "cannot be told: the server sent no Date header")
            return
        offset, error = got
        skew = self.settings.skew
        msg = f"offset against the remote {offset:+.1f} s (±{error:.1f} s, from its HTTP Date header)"
        self._warn_if(
            "clock",
            abs(offset) - error > skew / 2,
            msg,
            f": more than half of lease.skew={skew}s; sync this clock (NTP)",
            offsetSeconds=round(offset, 2),
            uncertaintySeconds=round(error, 2),
        )

    # ------------------------------------------------------------------------------- hooks, key
    def check_hooks(self) -> None:
        worktrees = [self.repo.cwd]
        for listed in gitq.worktree_list(self.repo.cwd, check=False):
            path = listed["worktree"]
            if os.path.isdir(path) and os.path.realpath(path) not in map(os.path.realpath, worktrees):
                worktrees.append(path)
        missing: dict[str, list[str]] = {}
        dirs = set()
        for wt in worktrees:
            hooks_dir = gitq.git_path(wt, "hooks") or ""
            dirs.add(hooks_dir)
            for name in HOOK_NAMES:
                if not _hook_installed(os.path.join(hooks_dir, name)):
                    missing.setdefault(name, []).append(wt)
        n = len(worktrees)
        where = f"{n} worktree{'s' if n != 1 else ''}"
        if not missing:
            self._add(
                "hooks", PASS, f"{' and '.join(HOOK_NAMES)} installed, reachable from {where}", hooksDirs=sorted(dirs)
            )
        elif all(len(v) == n for v in missing.values()) and len(missing) == len(HOOK_NAMES):
            self._add(
                "hooks",
                WARN,
                "gitlease hooks not installed (git lease install-hooks): leases are not checked on commit and push",
                hooksDirs=sorted(dirs),
            )
        else:
            parts = [f"{name} missing in {len(wts)} of {n} worktrees" for name, wts in missing.items()]
            self._add(
                "hooks",
                WARN,
                "gitlease hooks incomplete: " + "; ".join(parts) + " (a relative core.hooksPath resolves per worktree)",
                missing=missing,
                hooksDirs=sorted(dirs),
            )

    def check_signing_key(self) -> None:
        key = self.settings.signing_key
        if not key:
            self._add("signing-key", SKIP, "lease.signingKey not set: leases are unsigned")
            return
        if key.startswith(("key::", "ssh-")):
            if os.environ.get("SSH_AUTH_SOCK"):
                self._add("signing-key", PASS, "a literal public key: signing goes through ssh-agent")
            else:
                self._add("signing-key", FAIL, "a literal public key, but no ssh-agent (SSH_AUTH_SOCK unset)")
            return
        path = os.path.expanduser(key)
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            self._add("signing-key", FAIL, f"lease.signingKey {key} is not a readable file")
            return
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            self._add(
                "signing-key",
                WARN,
                f"{key} is readable by others (mode {mode:o}); ssh-keygen refuses such keys: chmod 600",
            )
            return
        self._add("signing-key", PASS, f"{key} readable, private to this user")


def _hook_installed(path: str) -> bool:
    try:
        if not os.access(path, os.X_OK):
            return False
        with open(path, "rb") as fh:
            return is_gitlease_hook(fh.read(65536).decode("utf-8", "replace"))
    except OSError:
        return False


def diagnose(
    repo: Repo,
    settings: Settings,
    *,
    clock: Clock = SYSTEM,
    on_check: Callable[[Check], None] | None = None,
    rounds: int = race.ROUNDS,
) -> Report:
    """Run every check; the report's ``ok`` is false when any check failed."""
    return Doctor(repo, settings, clock=clock, on_check=on_check, rounds=rounds).diagnose()


__all__ = [
    "Check",
    "Report",
    "Doctor",
    "DoctorFailed",
    "diagnose",
    "advertised_capabilities",
    "http_date_offset",
    "parse_git_version",
    "DOCTOR_PREFIX",
    "STALE_AFTER",
]
