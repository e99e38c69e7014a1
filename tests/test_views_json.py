"""A lease's JSON (LeaseView.to_json, what status --json prints: an interface scripts depend on) pinned to its
definition, field by field, and the kept-record rebuild and the nesting check answering as the plain definitions
they shortcut (issue 22). Behaviour only, never timings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gitlease.core import record as records
from gitlease.core.clock import iso
from gitlease.core.refnames import id_ref
from gitlease.service.views import INVALID, LeaseView, _any_nested

NOW = 1_800_000_000.0


def reference_json(v: LeaseView, now: float, skew: int) -> dict[str, object]:
    """LeaseView.to_json as status --json documents it: through state(), valid, refs(), to_json()."""
    rec = v.record
    refs = dict(v.scope_refs)
    refs.update(v.task_refs)
    if v.current_oid:
        refs[id_ref(v.lease_id)] = v.current_oid
    return {
        "leaseId": v.lease_id,
        "paths": list(v.paths),
        "state": v.state(now, skew),
        "valid": v.valid,
        "problems": list(v.problems),
        "signed": v.signed,
        "verification": v.verification if v.valid else INVALID,
        "signer": v.signer,
        "version": rec.version if rec else None,
        "owner": rec.owner.to_json() if rec else None,
        "workspaceId": rec.workspace_id if rec else None,
        "expiresAt": rec.expires_at if rec else None,
        "secondsLeft": int(rec.expires - now) if rec else None,
        "renewedAt": rec.renewed_at if rec else None,
        "stopBy": (rec.stop_by or rec.expires_at) if rec else None,
        "progress": rec.progress.to_json() if rec and rec.progress else None,
        "refs": refs,
    }


def _record(ttl: int, progress: bool, key: bool, stop_after: int | None) -> records.Record:
    owner = records.Owner(
        task_id="t", agent_id="a", host="h", pid=3, pid_start=9, key="ssh-ed25519 AAAA" if key else None
    )
    rec = records.new_record(
        lease_id="lease_0000000001aa",
        repo="r",
        paths=("a", "b/c"),
        workspace_id="w",
        owner=owner,
        now=NOW - 100,
        ttl=ttl,
        stop_after=stop_after,
    )
    if progress:
        rec = rec.next_version(NOW - 90, ttl=ttl, progress=records.Progress("half", 3, iso(NOW - 90)))
    return rec


@settings(max_examples=200)
@given(
    ttl=st.sampled_from([50, 70, 89, 90, 91, 99, 100, 120, 3600]),
    skew=st.sampled_from([0, 1, 30]),
    has_record=st.booleans(),
    kept=st.booleans(),
    progress=st.booleans(),
    key=st.booleans(),
    stop_after=st.sampled_from([None, 0, 10]),
    problems=st.lists(st.sampled_from(["broken", "replay"]), max_size=2),
    current=st.sampled_from([None, "c" * 40]),
    tasks=st.booleans(),
    verification=st.sampled_from(["unsigned", "verified", "untrusted"]),
)
def test_a_views_json_is_the_plain_definitions(
    ttl, skew, has_record, kept, progress, key, stop_after, problems, current, tasks, verification
):
    rec = _record(ttl, progress, key, stop_after) if has_record else None
    if rec is not None and kept:  # as the record cache rebuilds it (service/recordcache.py)
        rec = records.from_fields(records.to_fields(rec))
    v = LeaseView(
        lease_id="lease_0000000001aa",
        paths=rec.paths if rec else ("a",),
        record=rec,
        current_oid=current,
        grant_oid="g" * 40,
        scope_refs={"refs/leases/scope/a": "g" * 40},
        task_refs={"refs/leases/task/t": "g" * 40} if tasks else {},
        problems=list(problems),
        signed=key,
        verification=verification,
        signer="SHA256:x" if key else None,
    )
    got = v.to_json(NOW, skew)
    assert got == reference_json(v, NOW, skew) and list(got) == list(reference_json(v, NOW, skew))


segment = st.sampled_from(["a", "b", "ab", "a-b", "a.b", "c", "a/b"])
path = st.lists(segment, min_size=0, max_size=3).map(lambda xs: "/".join(xs) or ".")


@settings(max_examples=500)
@given(st.lists(path, max_size=8))
def test_nesting_is_found_as_the_segment_sort_found_it(paths):
    ordered = sorted(() if p == "." else tuple(p.split("/")) for p in paths)
    want = any(b[: len(a)] == a for a, b in zip(ordered, ordered[1:]))
    assert _any_nested(paths) == want
