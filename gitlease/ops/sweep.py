"""The stale-lease sweeper: which leases may be reclaimed, why and by whom (the judgement), and the reclaims
themselves (the execution), kept apart; and the forced (admin) reclaim.

Rules (docs/sweeping.md), each can be turned off in git config; a lease is judged on what one listing showed:

* ``expired``: ``expiresAt + lease.skew`` lies in the past (``lease.sweep.expired``);
* ``missed-heartbeats``: the lease declares ``renewEvery`` and has not been renewed for two intervals plus the
  skew margin, even if its TTL is long (``lease.sweep.missedHeartbeats``);
* ``dead-holder``: the holder ran on this host and its process is gone, judged by pid AND process start time
  so a reused pid is not mistaken for the holder (``lease.sweep.deadHolder``);
* ``stalled``: the lease reported progress once (``renew --progress``) and then not for ``lease.progressTimeout``
  plus the skew margin (only when that key is set).

The three early rules (all but ``expired``) never apply before the version's stop deadline (``stopBy``: the
instant by which its holder will have stopped if it heard of no later renewal) plus ``lease.skew``: a reclaim
never precedes the holder's stop. Who may reclaim (``authorize``): anyone trusted for what is expired; an
ordinary trusted key for a dead holder on its own host; a gitlease-admin key for the other early rules.

An invalid lease is never reclaimed by a rule (it fails closed); only ``--force`` by an admin clears it.
Every reclaim is ``LeaseService.reclaim`` (a sweep: ``reclaim_many``, many leases a push): atomic, deleting
exactly the lease's refs at the versions read and appending the audit entry. A lease that changed in between
survives (the others are reclaimed without it); the sweep says so and moves on. The module prints nothing; the
CLI renders its results.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gitlease.core.clock import iso, parse_iso
from gitlease.core.errors import Forbidden, GitLeaseError
from gitlease.core.procs import can_tell, process_start
from gitlease.core.refnames import id_ref
from gitlease.service.leases import LeaseService
from gitlease.service.views import HALF_DELETED, LeaseView


@dataclass(frozen=True)
class Verdict:
    rule: str  # expired | missed-heartbeats | dead-holder | stalled | forced
    reason: str  # key=value words, e.g. "expired=164s"


@dataclass
class Planned:
    """One lease the judgement found reclaimable now: why (``verdict``) and who reclaims it (``by``: the audit
    entry's ``by``), or why this sweeper may not (``refusal``; ``by`` None)."""

    view: LeaseView
    verdict: Verdict
    by: str | None
    refusal: str = ""


@dataclass
class SweepResult:
    lease_id: str
    owner: str  # the holder's task id ("?" when the record is unreadable)
    rule: str
    reason: str
    outcome: str  # reclaimed | would-reclaim | renewed | gone | forbidden | failed
    detail: str = ""
    audit: str | None = None  # the audit entry's commit

    def line(self) -> str:
        head = f"{self.lease_id} owner={self.owner} {self.reason}"
        if self.outcome == "reclaimed":
            return f"reclaimed: {head}"
        if self.outcome == "would-reclaim":
            return f"would reclaim: {head}"
        if self.outcome == "renewed":
            return f"skipped: {head}: renewed since it was read, it stays"
        if self.outcome == "gone":
            return f"skipped: {head}: already gone (reclaimed or released by another)"
        if self.outcome == "forbidden":
            return f"skipped: {head}: {self.detail}"
        return f"failed: {head}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "leaseId": self.lease_id,
            "owner": self.owner,
            "rule": self.rule,
            "reason": self.reason,
            "outcome": self.outcome,
            "detail": self.detail,
            "audit": self.audit,
        }


@dataclass
class Sweep:
    results: list[SweepResult]
    examined: int
    at: float
    dry_run: bool
    pushes: int = 0  # pushes the reclaims took (a batch is one, plus one per retry after a lost race)

    @property
    def failed(self) -> list[SweepResult]:
        return [r for r in self.results if r.outcome == "failed"]


# ---------------------------------------------------------------------------------- rules


def proc_available() -> bool:
    """The dead-holder rule needs /proc (Linux); elsewhere it never fires."""
    return can_tell()


MAX_BATCH_REFS = 2000  # ref updates per batched push (deletes and audit entries)
EXPIRY_RULES = ("expired", "half-deleted")  # rules about expired leases: any trusted agent may apply them


def judge(
    view: LeaseView, now: float, settings, *, host: str, proc_start: Callable[[int], int | None] | None = process_start
) -> Verdict | None:
    """Why ``view`` may be reclaimed now, or None. ``proc_start`` None: the dead-holder rule is unavailable."""
    if (
        view.record is not None
        and view.problems == [HALF_DELETED]
        and settings.sweep_expired
        and now > view.record.expires + settings.skew
    ):
        # Only an id ref is left (a server killed while it deleted the lease's refs): it is invalid, so it
        # blocks its paths, but it grants nothing (no scope refs) and has expired: reclaim it like an expired one.
        return Verdict("half-deleted", f"expired={int(now - view.record.expires)}s scope-refs=none")
    if not view.valid or view.record is None:
        return None
    rec, skew = view.record, settings.skew
    if settings.sweep_expired and now > rec.expires + skew:
        return Verdict("expired", f"expired={int(now - rec.expires)}s")
    if now <= rec.stop_deadline + skew:
        return None  # the early rules wait until the holder has stopped by its own promise (and the skew margin)
    own = rec.owner
    if settings.sweep_dead_holder and proc_start and own.host == host and own.pid > 0 and own.pid_start is not None:
        start = proc_start(own.pid)
        if start != own.pid_start:
            return Verdict("dead-holder", f"holder-gone=pid:{own.pid}" + (":reused" if start is not None else ""))
    if settings.sweep_missed_heartbeats and rec.renew_every:
        silent = now - rec.renewed
        if silent > 2 * rec.renew_every + skew:
            return Verdict(
                "missed-heartbeats", f"missed-heartbeats={int(silent // rec.renew_every)} silent={int(silent)}s"
            )
    if settings.progress_timeout and rec.progress is not None:
        stalled = now - parse_iso(rec.progress.at)
        if stalled > settings.progress_timeout + skew:
            return Verdict("stalled", f"stalled={int(stalled)}s")
    return None


def authorize(service: LeaseService, view: LeaseView, verdict: Verdict, now: float, *, host: str) -> str:
    """Who reclaims ``view`` by ``verdict`` (the audit entry's ``by``), or Forbidden. An expired lease: any agent.
    A live lease of a dead holder on this host (the rule can only be judged here, where its pid lived): a key
    trusted for this agent, or an admin. Any other early rule: a gitlease-admin key (unsigned stores: anyone)."""
    if verdict.rule in EXPIRY_RULES or view.state(now, service.settings.skew) == "expired":
        return service.settings.agent
    action = f"reclaiming a live lease by the {verdict.rule} rule"
    rec = view.record
    if verdict.rule == "dead-holder" and rec is not None and rec.owner.host == host:
        try:
            return service.require_trusted(f"{action} on the holder's host")
        except Forbidden as exc:
            try:
                return service.require_admin(action)
            except Forbidden:
                raise exc from None
    return service.require_admin(action)


# -------------------------------------------------------------------------------- sweeper


class Sweeper:
    """``before_reclaim(view, verdict)`` is a seam for tests: it runs between the read and the write."""

    def __init__(
        self,
        service: LeaseService,
        *,
        before_reclaim: Callable[[LeaseView, Verdict], None] | None = None,
        host: str | None = None,
        rotate: bool = True,
        batch: int = 200,
    ) -> None:
        self.service = service
        self.before_reclaim = before_reclaim
        self.host = host or os.uname().nodename
        self.rotate = rotate  # start at a random stale lease, so concurrent sweepers rarely race for the same one
        self.batch = batch  # leases reclaimed per push (at most; fewer when they have many refs)
        self.pushes = 0  # pushes made by the reclaims of this sweeper

    def plan(self, snap=None, *, authorized: bool = True) -> tuple[list[Planned], int, float]:
        """The judgement, from one listing (``snap``, else a fresh one): each lease that may be reclaimed now,
        why, and by whom (``authorized``: decided too; else ``by`` is left None). Changes nothing. Returns
        (planned, leases examined, the time judged at)."""
        svc = self.service
        snap = snap if snap is not None else svc.snapshot(use_cache=False)
        now = svc.clock.now()
        proc = process_start if proc_available() else None
        planned: list[Planned] = []
        for view in snap.leases:
            verdict = judge(view, now, svc.settings, host=self.host, proc_start=proc)
            if verdict is None:
                continue
            if not authorized:
                planned.append(Planned(view, verdict, None))
                continue
            try:
                planned.append(Planned(view, verdict, authorize(svc, view, verdict, now, host=self.host)))
            except Forbidden as exc:
                planned.append(Planned(view, verdict, None, exc.message))
        return planned, len(snap.leases), now

    def sweep(self, *, dry_run: bool = False, limit: int = 0) -> Sweep:
        """Judge (``plan``), then reclaim what the judgement allows: up to ``batch`` leases a push, each lease's
        deletes with its audit entry in the same atomic push; a lease that changed since it was read stays, and
        the others are reclaimed without it."""
        planned, examined, now = self.plan(authorized=not dry_run)
        if self.rotate and planned:
            k = random.randrange(len(planned))
            planned = planned[k:] + planned[:k]
        if planned and not dry_run:
            self.service.check_writer()  # an audit entry every reader reports INVALID helps no one: refused (exit 5)
        results: list[SweepResult | None] = []
        batch: list[tuple[int, Planned]] = []  # reclaims, made together (``_reclaim_batch``)
        for p in planned:
            view, verdict = p.view, p.verdict
            if limit and len(results) >= limit:
                break
            if dry_run:
                results.append(_result(view, verdict, "would-reclaim"))
                continue
            if p.by is None:
                results.append(_result(view, verdict, "forbidden", detail=p.refusal))
                continue
            batch.append((len(results), p))
            results.append(None)
        fresh: dict[str, str] | None = None  # a later listing, learnt from a lost race: skip what it rules out
        group: list[tuple[int, Planned]] = []
        for n, (idx, p) in enumerate(batch):
            if fresh is not None and any(fresh.get(r) != o for r, o in p.view.refs().items()):
                results[idx] = _lost(p.view, p.verdict, fresh)
            else:
                group.append((idx, p))
            refs_in_group = sum(len(q.view.refs()) + 1 for _, q in group)
            if group and (len(group) >= self.batch or refs_in_group >= MAX_BATCH_REFS or n == len(batch) - 1):
                fresh = self._reclaim_batch(group, results) or fresh
                group = []
        return Sweep([r for r in results if r is not None], examined, now, dry_run, pushes=self.pushes)

    def _reclaim_batch(
        self, group: list[tuple[int, Planned]], results: list[SweepResult | None]
    ) -> dict[str, str] | None:
        """Reclaim ``group`` in as few pushes as git allows (``LeaseService.reclaim_many``: one atomic push,
        again without any lease that changed since it was read); each lease's refs and its audit entry land
        together or not at all. Returns the refs as last re-read after a lost race (or None)."""
        if self.before_reclaim:
            for _, p in group:
                self.before_reclaim(p.view, p.verdict)
        got, pushes = self.service.reclaim_many(
            [(p.view, "reclaim", p.verdict.rule, p.verdict.reason, p.by) for _, p in group]
        )
        self.pushes += pushes
        fresh = None
        held = self.service.held_here()
        for (idx, p), a in zip(group, got):
            if a.ok:
                if p.view.lease_id in held:
                    self.service.forget(p.view.lease_id)  # this worktree held it: it does no more
                results[idx] = _result(p.view, p.verdict, "reclaimed", audit=a.oid)
            elif a.status == "changed":
                results[idx] = _lost(p.view, p.verdict, a.refs)
                fresh = a.refs
            else:
                results[idx] = _result(p.view, p.verdict, "failed", detail=a.message or "the store refused the reclaim")
        return fresh

    def _reclaim(
        self, view: LeaseView, verdict: Verdict, *, action: str, by: str
    ) -> tuple[SweepResult, dict[str, str] | None]:
        if self.before_reclaim:
            self.before_reclaim(view, verdict)
        got = self.service.reclaim(view, action=action, rule=verdict.rule, reason=verdict.reason, by=by)
        if got.ok:
            self.service.forget(view.lease_id)  # if this worktree held it, it does no more
            return _result(view, verdict, "reclaimed", audit=got.oid), None
        if got.status == "changed":
            return _lost(view, verdict, got.refs), got.refs
        return _result(view, verdict, "failed", detail=got.message or "the store refused the reclaim"), None

    def force(self, lease_id: str, *, action: str = "reclaim") -> SweepResult:
        """Reclaim ``lease_id`` whatever its state (live, invalid): admin only, audited."""
        import re

        from gitlease.core.record import check_lease_id

        if not re.fullmatch(r"\?[0-9a-f]{6,64}", lease_id):  # "?<oid>": an unreadable lease, named by its ref
            check_lease_id(lease_id)
        svc = self.service
        admin = svc.require_admin("a forced release" if action == "force-release" else "reclaiming a live lease")
        view = svc.snapshot(use_cache=False).find(lease_id)
        if view is None:
            raise GitLeaseError(f"no lease {lease_id} on store {svc.store.name}", leaseId=lease_id)
        state = view.state(svc.clock.now(), svc.settings.skew)
        return self._reclaim(view, Verdict("forced", f"forced={state}"), action=action, by=admin)[0]


def _lost(view: LeaseView, verdict: Verdict, refs: dict[str, str]) -> SweepResult:
    """The lease is no longer as read: renewed (it stays) or gone (released, or reclaimed by another)."""
    cur = refs.get(id_ref(view.lease_id))
    if cur is not None and cur != view.current_oid:
        return _result(view, verdict, "renewed", detail=f"now at {cur[:12]}")
    return _result(view, verdict, "gone")


def _result(
    view: LeaseView, verdict: Verdict, outcome: str, *, detail: str = "", audit: str | None = None
) -> SweepResult:
    owner = view.record.owner.task_id if view.record else "?"
    return SweepResult(view.lease_id, owner, verdict.rule, verdict.reason, outcome, detail, audit)


# ------------------------------------------------------------------------------------ log


@dataclass(frozen=True)
class LogEvent:
    at: str
    event: str  # acquire | renew | reclaim | clear | force-release
    lease_id: str
    version: int | None
    by: str
    detail: str
    source: str  # lease (a version of a lease the store still holds, or one an audit entry kept) | audit
    oid: str
    signed: bool
    problem: str | None = None

    def line(self) -> str:
        ver = f"v{self.version}" if self.version is not None else "v?"
        mark = "" if self.signed else "  [unsigned]"
        bad = f"  INVALID: {self.problem}" if self.problem else ""
        return f"{self.at}  {self.event:<13} {self.lease_id}  {ver}  by={self.by}  {self.detail}".rstrip() + mark + bad

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "event": self.event,
            "leaseId": self.lease_id,
            "version": self.version,
            "by": self.by,
            "detail": self.detail,
            "source": self.source,
            "oid": self.oid,
            "signed": self.signed,
            "problem": self.problem,
        }


def history(service: LeaseService, *, since: float | None = None, lease_id: str | None = None) -> list[LogEvent]:
    """The audit log merged with lease history: every version (acquire = v1, renew = vN) of each lease the
    store still holds, and of each lease an audit entry kept reachable. A lease released by its holder leaves
    nothing behind (its refs are gone and nothing points at its versions)."""
    from gitlease.identity.trust import check_audit_entry
    from gitlease.service.audit import read_log

    service.require_store()
    store = service.store
    trust = service.trust()
    entries = read_log(store, verify=lambda data, sig, doc: check_audit_entry(trust, doc, data, sig))
    snap = service.snapshot(use_cache=False)
    heads = {v.current_oid or v.grant_oid for v in snap.leases if v.valid} | {e.pointer for e in entries if e.pointer}
    heads.discard(None)
    events: list[LogEvent] = []
    versions = _lease_versions(service, sorted(h for h in heads if h), trust)
    seen: set[str] = set()
    for oid, rec, signed, problem in versions:
        if oid in seen or rec is None:
            continue
        seen.add(oid)
        if rec.version == 1:
            events.append(
                LogEvent(
                    rec.acquired_at,
                    "acquire",
                    rec.lease_id,
                    1,
                    rec.owner.agent_id,
                    f"task={rec.owner.task_id} scope={','.join(rec.paths)} ttl={rec.ttl}s",
                    "lease",
                    oid,
                    signed,
                    problem,
                )
            )
        else:
            note = f" progress={rec.progress.counter}" if rec.progress else ""
            events.append(
                LogEvent(
                    rec.renewed_at,
                    "renew",
                    rec.lease_id,
                    rec.version,
                    rec.owner.agent_id,
                    f"expiresAt={rec.expires_at}{note}",
                    "lease",
                    oid,
                    signed,
                    problem,
                )
            )
    for e in entries:
        d = e.doc
        events.append(
            LogEvent(
                e.at or "?",
                str(d.get("action") or "?"),
                str(d.get("leaseId") or "?"),
                d.get("version") if isinstance(d.get("version"), int) else None,
                str(d.get("by") or "?"),
                f"{d.get('reason') or ''} owner={(d.get('owner') or {}).get('taskId', '?')} "
                f"writer={d.get('writer')} seq={d.get('seq')}",
                "audit",
                e.oid,
                e.signed,
                e.problem,
            )
        )
    if since is not None:
        cut = iso(since)
        events = [ev for ev in events if ev.at >= cut]
    if lease_id:
        events = [ev for ev in events if ev.lease_id == lease_id]
    events.sort(key=lambda ev: (ev.at, ev.source == "audit", ev.version or 0))
    return events


def _lease_versions(service: LeaseService, heads: list[str], trust):
    """(oid, record, signed, problem) of every lease version reachable from ``heads``, in one walk and one
    read; ``problem``: its signature does not verify against ``trust`` (None: fine, or unsigned store)."""
    from gitlease.core import gitq
    from gitlease.service.views import parse_blob

    if not heads:
        return []
    oids = gitq.log_commits(service.store.repo_dir, heads)
    blobs = service.store.read(oids, fetch=False)
    out = []
    for oid in oids:
        b = blobs.get(oid)
        if b is None:
            continue
        rec, problem = parse_blob(b)
        if rec is not None and problem is None:
            check = trust.check_version(rec, b.record, b.signature, service.clock.now())
            problem = check.problem
        out.append((oid, rec, b.signature is not None, problem))
    return out


__all__ = ["Sweeper", "Sweep", "SweepResult", "Verdict", "Planned", "judge", "authorize", "history", "LogEvent"]
