"""Fuzzing what a remote can feed a reader: arbitrary refs under refs/leases/ and arbitrary objects behind
them. Zero crashes, and fail closed: every path a ref under refs/leases/scope names stays blocked."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitlease.core import refnames
from gitlease.core import scope as scopes
from gitlease.core.clock import FakeClock
from gitlease.core.record import Owner, new_record
from gitlease.core.refnames import scope_ref
from gitlease.core.store import Blob
from gitlease.service.views import Snapshot, build_views

CLOCK = FakeClock()
segments = st.sampled_from(["a", "b", "src", "x.py", ".hidden", "%2e", "a.lock", "@", "-", "ü", "a b"])
ref_paths = st.lists(segments, min_size=0, max_size=3).map("/".join)
oids = st.sampled_from(["1" * 40, "2" * 40, "3" * 40, "4" * 40])
lease_ids = st.one_of(st.sampled_from(["lease_0000000000aaaaaa", "lease_0000000000bbbbbb"]), st.text(max_size=12))


def _good(paths, lease_id="lease_0000000000aaaaaa", version=1):
    owner = Owner(task_id="t", agent_id="a", host="h", pid=0)
    rec = new_record(lease_id=lease_id, repo="r", paths=paths, workspace_id="w", owner=owner, now=CLOCK.now(), ttl=60)
    return rec if version == 1 else rec.next_version(CLOCK.now())


def _blob_strategy():
    good = st.sampled_from([("a",), ("b", "src"), (".",)]).map(lambda p: _good(p).canonical())
    junk = st.one_of(st.binary(max_size=200), st.just(b"{}"), st.just(b"null"), st.just(b"x" * 70000))
    return st.builds(
        lambda rec, sig: Blob(rec, sig, None if rec is not None else "missing"),
        st.one_of(st.none(), good, junk),
        st.one_of(st.none(), st.binary(max_size=20)),
    )


refs_strategy = st.dictionaries(
    st.one_of(
        ref_paths.map(lambda p: "refs/leases/scope" + ("/" + p if p else "")),
        lease_ids.map(lambda i: "refs/leases/id/" + i),
        st.text(max_size=20).map(lambda s: "refs/leases/" + s),
    ),
    oids,
    max_size=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(refs_strategy, st.dictionaries(oids, _blob_strategy(), max_size=4))
def test_arbitrary_refs_and_objects_never_crash_and_fail_closed(refs, blobs):
    views = build_views(refs, blobs)
    snap = Snapshot(leases=views, fetched_at=CLOCK.now())
    for v in views:
        assert v.state(CLOCK.now(), 30) in ("active", "grace", "expired", "invalid")
        v.to_json(CLOCK.now(), 30)
    for ref in refs:
        if ref == "refs/leases/scope" or ref.startswith("refs/leases/scope/"):
            try:
                path = refnames.from_ref_suffix(ref[len("refs/leases/scope/") :]) if ref != "refs/leases/scope" else "."
                path = scopes.normalize(path)
            except Exception:
                continue  # undecodable: blocked under its first component (checked in test_service)
            blocking = snap.blocking([path], CLOCK.now(), 30)
            assert blocking, f"{ref} names {path!r}, and nothing blocks it"


@given(st.sampled_from(["a", "b/src", "."]))
def test_a_valid_grant_is_one_active_lease(path):
    rec = _good((path,))
    refs = {scope_ref(path): "1" * 40, "refs/leases/id/" + rec.lease_id: "1" * 40}
    views = build_views(refs, {"1" * 40: Blob(rec.canonical(), None, None)})
    assert [v.state(CLOCK.now(), 30) for v in views] == ["active"] and views[0].paths == (path,)
