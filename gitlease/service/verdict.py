"""``git lease doctor``'s verdict, kept on the store, and what ``acquire`` makes of it.

Doctor records what it found in ``refs/leases/verdict/<server>`` (``<server>``: a hash of the server's URL as
this clone reaches it, credentials left out): a commit holding ``verdict.json`` (``gitlease.doctor/1``: passed
or not, the failed checks, the server's identity: its URL and what it advertised, its agent string and
capabilities; the probe's version, rounds and the race rate they rule out; who ran it, when) and, when signed,
``verdict.sig`` (SSHSIG over the exact bytes, namespace gitlease, like a lease version). Each run's verdict is a
child of the one before.

Before its first acquire, a service checks the verdict for the server it talks to (``doctor_gate``): none, a
failing one, one of an older probe, or one that does not verify on a signed store, is a warning (``svc.warnings``:
the CLI prints it, the library only keeps it), or with ``lease.requireDoctor=true`` a refusal
(``DoctorRequired``, exit 1). A passing verdict is remembered in this clone for ``RECHECK`` seconds, the
want of one for ``RECHECK_MISSING`` (so an acquire reads it at most that often). The local store needs none:
its transactions are this machine's git's own ``update-ref``.
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gitlease.core import gitq
from gitlease.core.cachenames import cache_path
from gitlease.core.clock import iso
from gitlease.core.errors import GitLeaseError, RemoteUnavailable
from gitlease.core.fsutil import write_json
from gitlease.core.record import canonical
from gitlease.core.refnames import VERDICT_PREFIX
from gitlease.core.store import RefUpdate, RemoteStore

if TYPE_CHECKING:
    from gitlease.service.base import ServiceBase

SCHEMA = "gitlease.doctor/1"
FILE = "verdict.json"
SIG = "verdict.sig"
MAX_BYTES = 65536
MIN_ROUNDS = 30  # rounds of the concurrency probe a passing verdict needs (a race in 15% of rounds shows)
PROBE_VERSION = 2  # of doctor's probes (the concurrency probe's rounds, shapes and gate): older verdicts are redone
RECHECK = 3600  # seconds a passing verdict read from the store is taken as it is
RECHECK_MISSING = 300  # seconds "no passing verdict" is remembered before the store is asked again


_CHECKED: weakref.WeakSet[ServiceBase] = weakref.WeakSet()  # services that checked (once each)


class DoctorRequired(GitLeaseError):
    """``lease.requireDoctor`` is set and the store has no passing doctor verdict for this server."""

    kind = "doctor-required"


@dataclass(frozen=True)
class Verdict:
    """What this clone knows of the server's verdict: ``ok`` True (passed), False (failed, missing, unusable)
    or None (could not be read)."""

    ok: bool | None
    reason: str
    url: str


def server_url(svc: ServiceBase) -> str:
    """The URL this clone reaches the store at (insteadOf applied, credentials left out; a local path made
    absolute, so that clones naming one repository differently agree)."""
    remote = svc.settings.remote or ""
    url = gitq.resolved_url(svc.repo.cwd, remote)
    if "://" in url:
        scheme, rest = url.split("://", 1)
        host, sep, path = rest.partition("/")
        if scheme == "file":
            return "file://" + os.path.realpath("/" + path)
        return f"{scheme}://{host.rpartition('@')[2]}{sep}{path}"
    if ":" in url.split("/", 1)[0]:  # scp-like: [user@]host:path
        return url.split("@", 1)[-1]
    return "file://" + os.path.realpath(os.path.join(svc.repo.cwd, url))


def verdict_ref(url: str) -> str:
    return VERDICT_PREFIX + hashlib.sha256(url.encode("utf-8")).hexdigest()[:20]


# ------------------------------------------------------------------------------------------- writing


def record(svc: ServiceBase, report: dict[str, Any], identity: dict[str, Any]) -> str:
    """Write doctor's verdict for the server ``svc`` talks to (``report``: Report.to_json(); ``identity``: what
    the server advertised and the probe's figures), on top of the verdict before it. Returns the ref."""
    url = server_url(svc)
    ref = verdict_ref(url)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "ok": bool(report["ok"]),
        "failed": [c["name"] for c in report["checks"] if c.get("status") == "fail"],
        "url": url,
        **identity,
        "probeVersion": PROBE_VERSION,
        "by": svc.settings.agent,
        "host": os.uname().nodename,
        "at": iso(svc.clock.now()),
        "key": svc.signer.public_key,
        "signing": "sshsig" if svc.signer.public_key else "unsigned",
        "nonce": os.urandom(8).hex(),
    }
    data = canonical(doc)
    sig = svc.signer.sign(data)
    message = "refused"
    for _ in range(5):  # another doctor run recorded one meanwhile: go again on top of it
        parent = _head(svc, ref)
        oid = svc.objects.signed_commit(
            FILE,
            data,
            SIG,
            sig,
            (parent,) if parent else (),
            AUTHOR,
            int(svc.clock.now()),
            f"doctor: {_said(doc)} {url}",
        )
        out = svc.store.apply([RefUpdate(ref, oid, parent)])
        if out.ok:
            _remember(svc, _judge(doc, None))
            return ref
        message = out.message or message
    raise GitLeaseError(f"could not record doctor's verdict in {ref}: {message}")


AUTHOR = "gitlease doctor <doctor@gitlease.invalid>"


def _said(doc: dict[str, Any]) -> str:
    return "pass" if doc.get("ok") is True else "fail"


# ------------------------------------------------------------------------------------------- reading


def doctor_gate(svc: ServiceBase) -> None:
    """Once per service, before its first acquire: the verdict for the server it talks to. Not passing: a
    warning in ``svc.warnings``, or with ``lease.requireDoctor`` DoctorRequired (exit 1)."""
    if svc in _CHECKED or not isinstance(svc.store, RemoteStore):
        return
    got = check(svc)
    _CHECKED.add(svc)
    if got.ok:
        return
    if svc.settings.require_doctor:
        raise DoctorRequired(
            f"lease.requireDoctor is set and {got.reason}: run git lease doctor --remote {svc.settings.remote}",
            url=got.url,
        )
    if got.ok is False:
        svc.warnings.append(f"{got.reason} (git lease doctor records one; lease.requireDoctor=true refuses)")


def check(svc: ServiceBase) -> Verdict:
    """The verdict for the server ``svc`` talks to: remembered in this clone, else read from the store."""
    path = cache_path(svc.repo.shared_dir(), "verdict", svc.store.name)
    try:
        with open(path) as fh:
            doc = json.load(fh)
        age = svc.clock.now() - float(doc["checkedAt"])
        if 0 <= age < (RECHECK if doc["ok"] else RECHECK_MISSING):
            return Verdict(doc["ok"], str(doc["reason"]), str(doc["url"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    url = server_url(svc)
    try:
        got = read(svc, url)
    except (RemoteUnavailable, GitLeaseError) as exc:
        return Verdict(None, f"the doctor verdict for {url} could not be read ({exc})", url)
    _remember(svc, got)
    return got


def read(svc: ServiceBase, url: str) -> Verdict:
    """Read and judge ``refs/leases/verdict/<url>`` on the store (its signature checked on a signed store)."""
    ref = verdict_ref(url)
    oid = _head(svc, ref)
    if oid is None:
        return Verdict(False, f"no doctor verdict for {url} on this store", url)
    svc.store.ensure_objects([oid])
    data = svc.store.file_at(oid, FILE, limit=MAX_BYTES)
    try:
        doc = json.loads((data or b"").decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or canonical(doc) != data:
        return Verdict(False, f"the doctor verdict for {url} is unreadable ({ref})", url)
    from gitlease.identity.trust import check_audit_entry  # same rules as an audit entry's signature

    problem = check_audit_entry(svc.trust(), doc, data, svc.store.file_at(oid, SIG, limit=MAX_BYTES))
    return _judge(doc, problem)


def _judge(doc: dict[str, Any], problem: str | None) -> Verdict:
    url = str(doc.get("url"))
    if problem:
        return Verdict(False, f"the doctor verdict for {url} does not verify ({problem})", url)
    if doc.get("ok") is not True:
        failed = ", ".join(str(n) for n in doc.get("failed") or ()) or "a check"
        return Verdict(False, f"git lease doctor failed {url} on {doc.get('at')} ({failed})", url)
    if not isinstance(doc.get("probeVersion"), int) or doc["probeVersion"] < PROBE_VERSION:
        return Verdict(False, f"the doctor verdict for {url} is from an older probe: run doctor again", url)
    rounds = doc.get("rounds")
    if not isinstance(rounds, int) or rounds < MIN_ROUNDS:
        return Verdict(False, f"git lease doctor raced {url} in {rounds} rounds only (at least {MIN_ROUNDS})", url)
    return Verdict(True, f"git lease doctor passed {url} on {doc.get('at')}", url)


def _remember(svc: ServiceBase, got: Verdict) -> None:
    path = cache_path(svc.repo.shared_dir(), "verdict", svc.store.name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json(path, {"url": got.url, "ok": got.ok, "reason": got.reason, "checkedAt": svc.clock.now()})
    except OSError:
        pass  # a cache: the next acquire asks the store again


def _head(svc: ServiceBase, ref: str) -> str | None:
    """The verdict ref's commit on the store, read now (RemoteUnavailable when it cannot be read)."""
    store = svc.store
    if not isinstance(store, RemoteStore):
        return gitq.refs(store.repo_dir, ref, check=True).get(ref)
    res = store._ls_remote(["ls-remote", "--refs", store.remote, ref], None)
    return gitq.parse_oid_ref_lines(res.out).get(ref)


__all__ = ["DoctorRequired", "Verdict", "check", "doctor_gate", "read", "record", "server_url", "verdict_ref"]
