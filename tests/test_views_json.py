"""A lease's JSON (LeaseView.to_json, what status --json prints: an interface scripts depend on) pinned to its
definition, field by field, and the kept-record rebuild and the nesting check answering as the plain definitions
they shortcut (issue 22). Behaviour only, never timings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gitlease.core import record as records
from gitlease.core.clock import iso
from gitlease.service.views import INVALID, LeaseView, _any_nested

NOW = 1_800_000_000.0


KEYS = [  # status --json's fields of a lease, in order: scripts read them
    "leaseId",
    "paths",
    "state",
    "valid",
    "problems",
    "signed",
    "verification",
    "signer",
    "version",
    "owner",
    "workspaceId",
    "expiresAt",
    "secondsLeft",
    "renewedAt",
    "stopBy",
    "progress",
    "refs",
]


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
    fresh = _record(ttl, progress, key, stop_after) if has_record else None

    def view(rec):
        return LeaseView(
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

    v = view(fresh)
    got = v.to_json(NOW, skew)
    assert list(got) == KEYS
    assert got["state"] == v.state(NOW, skew) and got["valid"] == v.valid and got["refs"] == v.refs()
    assert got["owner"] == (fresh.owner.to_json() if fresh else None)
    assert got["verification"] == (verification if v.valid else INVALID)
    if fresh is not None and kept:  # as the record cache rebuilds it (service/recordcache.py): the same JSON
        again = view(records.from_fields(records.to_fields(fresh))).to_json(NOW, skew)
        assert again == got and list(again) == KEYS


segment = st.sampled_from(["a", "b", "ab", "a-b", "a.b", "c", "a/b"])
path = st.lists(segment, min_size=0, max_size=3).map(lambda xs: "/".join(xs) or ".")


@settings(max_examples=500)
@given(st.lists(path, max_size=8))
def test_nesting_is_found_as_the_segment_sort_found_it(paths):
    ordered = sorted(() if p == "." else tuple(p.split("/")) for p in paths)
    want = any(b[: len(a)] == a for a, b in zip(ordered, ordered[1:]))
    assert _any_nested(paths) == want
