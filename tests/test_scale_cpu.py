"""Reads at scale, the CPU half (issue 22): the trie and the one-parse reads answer exactly as the double loops
and repeated parses they replace. Behaviour only, never timings."""

from __future__ import annotations

from conftest import answer
from hypothesis import given, settings
from hypothesis import strategies as st

from gitlease.core import record as records
from gitlease.core import scope as scopes
from gitlease.core.store import Blob
from gitlease.service.views import LeaseView, Snapshot, build_views

NOW = 1_800_000_000.0
SKEW = 30

segment = st.sampled_from(["a", "b", "ab", "a-b", "a.b", "c"])
path = st.lists(segment, min_size=0, max_size=3).map(lambda xs: "/".join(xs) or ".")


def _record(paths: tuple[str, ...], ttl: int, k: int) -> records.Record:
    owner = records.Owner(task_id=f"t{k}", agent_id="a", host="h", pid=0)
    return records.new_record(
        lease_id=f"lease_{k:08d}aa", repo="r", paths=paths, workspace_id="w", owner=owner, now=NOW - 100, ttl=ttl
    )


view_spec = st.tuples(
    st.lists(path, min_size=0, max_size=3),
    st.sampled_from(["valid", "expired", "grace", "invalid", "norecord"]),
)


def _views(specs) -> list[LeaseView]:
    out = []
    for k, (ps, kind) in enumerate(specs):
        paths = scopes.minimize(ps) if ps else ()
        ttl = {"expired": 50, "grace": 90}.get(kind, 3600)
        rec = _record(paths, ttl, k) if paths and kind != "norecord" else None
        v = LeaseView(lease_id=f"lease_{k:08d}aa", paths=paths, record=rec)
        if kind == "invalid" or rec is None:
            v.problems.append("broken")
        out.append(v)
    return out


def naive_overlapping(snap: Snapshot, paths) -> list[LeaseView]:
    paths = list(paths)
    return [v for v in snap.leases if scopes.sets_overlap(v.paths, paths)]


def naive_overlaps(snap: Snapshot) -> list[tuple[LeaseView, LeaseView]]:
    live = [v for v in snap.leases if v.valid and v.state(NOW, SKEW) != "expired"]
    return [(a, b) for i, a in enumerate(live) for b in live[i + 1 :] if scopes.sets_overlap(a.paths, b.paths)]


@settings(max_examples=300)
@given(st.lists(view_spec, max_size=12), st.lists(path, min_size=1, max_size=4))
def test_snapshot_queries_match_the_double_loop(specs, query):
    """blocking / overlapping / overlaps through the trie: the same leases, in the same order, as before."""
    snap = Snapshot(_views(specs), NOW)
    assert snap.overlapping(query) == naive_overlapping(snap, query)
    want = [v for v in naive_overlapping(snap, query) if v.state(NOW, SKEW) != "expired"]
    assert snap.blocking(query, NOW, SKEW) == want
    assert snap.overlaps(NOW, SKEW) == naive_overlaps(snap)


def test_snapshot_index_follows_a_replaced_or_grown_lease_list():
    snap = Snapshot(_views([(["a"], "valid")]), NOW)
    assert [v.lease_id for v in snap.overlapping(["a/x"])] == ["lease_00000000aa"]
    snap.leases = _views([(["b"], "valid")])
    assert snap.overlapping(["a/x"]) == [] and len(snap.overlapping(["b"])) == 1
    snap.leases.append(_views([(["b"], "valid"), (["a"], "valid")])[1])
    assert [v.lease_id for v in snap.overlapping(["."])] == ["lease_00000000aa", "lease_00000001aa"]


def test_build_views_parses_each_object_once(monkeypatch):
    """A lease's id ref and its scope refs point at the same grant: one parse, one Record shared."""
    from gitlease.core.refnames import id_ref, scope_ref

    rec = _record(("a", "b/c"), 3600, 1)
    oid = "1" * 40
    refs = {id_ref(rec.lease_id): oid, scope_ref("a"): oid, scope_ref("b/c"): oid}
    calls = []
    real = records.parse
    monkeypatch.setattr(records, "parse", lambda data: calls.append(data) or real(data))
    views = build_views(refs, {oid: Blob(rec.canonical(), None)})
    assert len(calls) == 1
    assert len(views) == 1 and views[0].valid and views[0].record == rec
    assert views[0].paths == ("a", "b/c") and views[0].grant_oid == views[0].current_oid == oid


def loop_lookup(snap: Snapshot, mine_ids, now, skew):
    """verify.others_lookup as it was: every path against every blocking lease."""
    from gitlease.enforce import rules as enforce
    from gitlease.enforce.verify import holder

    blocking = [v for v in snap.leases if v.lease_id not in mine_ids and v.state(now, skew) != "expired"]

    def lookup(paths):
        out = {}
        for p in paths:
            for v in blocking:
                s = enforce.covering(v.paths, p)
                if s is None:
                    continue
                out[p] = holder(v, s, now)
                break
        return out

    return lookup


file_path = st.lists(segment, min_size=1, max_size=4).map("/".join)


@settings(max_examples=300)
@given(st.lists(view_spec, max_size=12), st.lists(file_path, max_size=8), st.sets(st.integers(0, 11), max_size=3))
def test_others_lookup_names_the_same_holders_as_the_loop(specs, paths, mine):
    """The pre-push / verify / server-hook lookup by prefix: the same holder, scope and facts for every path."""
    from gitlease.enforce.verify import others_lookup

    snap = Snapshot(_views(specs), NOW)
    mine_ids = {f"lease_{k:08d}aa" for k in mine}
    got = others_lookup(snap, mine_ids, NOW, SKEW)(paths)
    want = loop_lookup(snap, mine_ids, NOW, SKEW)(paths)
    assert {p: h.to_json() for p, h in got.items()} == {p: h.to_json() for p, h in want.items()}


def test_others_lookup_odd_scopes_of_invalid_views():
    """Invalid views can hold paths no record would (a foreign ref's components): looked up exactly as before."""
    from gitlease.enforce.verify import others_lookup

    views = _views([(["a"], "invalid"), (["x/y"], "valid")])
    views.append(LeaseView(lease_id="?refs/leases/scope/%zz", paths=("%zz",), problems=["not a scope ref"]))
    views.append(LeaseView(lease_id="?root", paths=(".",), problems=["unreadable"]))
    snap = Snapshot(views, NOW)
    paths = ["a", "a/b", "%zz/q", "x/y/z", "x/yz", "q"]
    got = others_lookup(snap, set(), NOW, SKEW)(paths)
    want = loop_lookup(snap, set(), NOW, SKEW)(paths)
    assert {p: h.to_json() for p, h in got.items()} == {p: h.to_json() for p, h in want.items()}
    assert got["q"].lease_id == "?root" and got["x/y/z"].lease_id == "lease_00000001aa"


def _decode_reference(component: str) -> str:
    """refnames.decode_segment without its shortcut, read off the encoder: each ``XX`` (upper-case hex) after the
    escape (``%`` in an earlier version's form, else ``+``) is a byte, any other character stands for itself; the
    answer only if it is UTF-8 and encoding it again gives the component back (ValueError otherwise)."""
    import re

    from gitlease.core.refnames import encode_segment, legacy_segment

    esc, encode = ("%", legacy_segment) if "%" in component else ("+", encode_segment)
    pieces = re.findall(rf"{re.escape(esc)}([0-9A-F]{{2}})|(.)", component, re.S)
    segment = b"".join(bytes.fromhex(hx) if hx else ch.encode() for hx, ch in pieces).decode("utf-8")
    if encode(segment) != component:
        raise ValueError(component)
    return segment


@given(st.text(st.sampled_from(list("aZ09-_.%+2E@ü/")), max_size=12))
def test_decode_segment_shortcut_answers_as_the_full_decode(component):
    from gitlease.core.refnames import decode_segment

    assert answer(decode_segment, component) == answer(_decode_reference, component)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.lists(path, min_size=1, max_size=3), st.just("valid")), max_size=10))
def test_overlaps_without_any_nesting_is_empty_and_otherwise_exact(specs):
    snap = Snapshot(_views(specs), NOW)
    assert snap.overlaps(NOW, SKEW) == naive_overlaps(snap)


# ---------------------------------------------------- a read restricted to some paths (bearing.restrict_refs)

KINDS = ["plain", "renewed", "id-only", "scope-only", "a-ref-missing", "extended", "forged-id", "no-record"]


def _store(specs):
    """refs and blobs of a store with the faults a reader must judge (fake commit ids; records real)."""
    from gitlease.core.refnames import id_ref, scope_ref, task_ref

    refs: dict[str, str] = {}
    blobs: dict[str, Blob] = {}
    n = [0]

    def commit(rec) -> str:
        n[0] += 1
        oid = f"{n[0]:040x}"
        blobs[oid] = Blob(rec.canonical() if rec is not None else None, None, None if rec else "not a lease commit")
        return oid

    for k, (ps, kind) in enumerate(specs):
        paths = scopes.minimize(ps) if ps else (".",)
        rec = _record(paths, 3600, k)
        grant = commit(rec if kind != "no-record" else None)
        current = grant
        if kind in ("renewed", "extended"):
            later = rec.next_version(now=NOW - 50)
            if kind == "extended":
                import dataclasses

                extra = scopes.minimize((*paths, f"x{k}"))
                later = dataclasses.replace(later, paths=extra)
            current = commit(later)
        lid = rec.lease_id
        if kind != "scope-only":
            refs[id_ref(lid)] = current
        if kind == "forged-id":
            refs[id_ref(f"lease_{k:08d}zz")] = current  # another lease's id ref pointing at this record
        if kind != "id-only":
            held = paths[1:] if kind == "a-ref-missing" and len(paths) > 1 else paths
            for p in held:
                refs[scope_ref(p)] = grant
            if k % 3 == 0:
                refs[task_ref(f"task-{k}")] = grant
    refs["refs/leases/scope/a/%zz"] = f"{999:040x}"  # a ref gitlease cannot have written: blocks "a/%zz"
    refs["refs/leases/outcome/t"] = f"{998:040x}"
    return refs, blobs


def _index(refs, blobs):
    from gitlease.service.views import parse_blob

    out = {}
    for oid in set(refs.values()):
        rec, _problem = parse_blob(blobs.get(oid, Blob(None, None, "missing")))
        out[oid] = (rec.lease_id, "\n".join(rec.paths)) if rec is not None else None
    return out


def _seen(views):
    return [(v.lease_id, v.paths, v.record, sorted(v.problems), v.refs(), v.valid) for v in views]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.lists(path, min_size=0, max_size=3), st.sampled_from(KINDS)), max_size=10),
    st.lists(path, min_size=1, max_size=4),
    st.sets(st.integers(0, 9), max_size=2),
)
def test_a_read_restricted_to_some_paths_sees_what_the_full_read_sees_there(specs, query, keep):
    from gitlease.core.bearing import restrict_refs

    refs, blobs = _store(specs)
    query = list(scopes.minimize(query))
    full = Snapshot(build_views(refs, blobs), NOW)
    keep_ids = {f"lease_{k:08d}aa" for k in keep}
    used, present = restrict_refs(refs, _index(refs, blobs), query, keep_ids)
    part = Snapshot(build_views(used, blobs), NOW)
    assert _seen(part.overlapping(query)) == _seen(full.overlapping(query))
    assert _seen(part.blocking(query, NOW, SKEW)) == _seen(full.blocking(query, NOW, SKEW))
    for lid in keep_ids:  # the leases asked for, exactly as the full read has them
        assert _seen([v for v in part.leases if v.lease_id == lid]) == _seen(
            [v for v in full.leases if v.lease_id == lid]
        )
    assert present == {v.lease_id for v in full.leases if not v.lease_id.startswith("?")}
    assert set(used.items()) <= set(refs.items())


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(st.text("ab-_Z09", min_size=0, max_size=90), st.sampled_from(["a.b", "%41", "x" * 251, ""])),
        min_size=1,
        max_size=4,
    )
)
def test_a_scope_ref_of_plain_characters_decodes_as_the_full_decode_does(components):
    """path_of_scope_ref's shortcut for names of letters, digits, '-', '_' and '/' answers as the decode and
    the normalisation check it skips (too long a component, an empty one: refused alike)."""
    from gitlease.core.refnames import SCOPE_REF, from_ref_suffix, path_of_scope_ref

    ref = SCOPE_REF + "/" + "/".join(components)
    try:
        path = from_ref_suffix(ref[len(SCOPE_REF) + 1 :])
        want = path if scopes.normalize(path) == path else None
    except Exception:
        want = None
    try:
        got = path_of_scope_ref(ref)
    except ValueError:
        got = None
    assert got == want
