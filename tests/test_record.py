import json

import pytest
from conftest import answer
from hypothesis import given
from hypothesis import strategies as st

from gitlease.core import record
from gitlease.core.errors import InvalidRecord


def sample(**kw):
    owner = record.Owner(task_id="job_1", agent_id="agent-1", host="h", pid=0)
    args = dict(
        lease_id=record.new_lease_id(1_800_000_000),
        repo="r",
        paths=("a", "b/c"),
        workspace_id="w",
        owner=owner,
        now=1_800_000_000,
        ttl=300,
    )
    args.update(kw)
    return record.new_record(**args)


def test_roundtrip_canonical():
    rec = sample()
    data = rec.canonical()
    assert record.parse(data) == rec
    assert data == json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
    doc = json.loads(data)
    required = "schema leaseId repo scope workspaceId owner status version acquiredAt expiresAt nonce".split()
    assert set(required) <= set(doc)
    assert doc["scope"] == {"kind": "path-set", "paths": ["a", "b/c"]}


def test_next_version_new_nonce():
    rec = sample()
    nxt = rec.next_version(1_800_000_100)
    assert nxt.version == 2 and nxt.nonce != rec.nonce and nxt.expires_at == "2027-01-15T08:06:40Z"


@pytest.mark.parametrize(
    "mutate,why",
    [
        (lambda d: b"not json", "not JSON"),
        (lambda d: d.replace(b'"schema":"gitlease.lease/1"', b'"schema":"other/9"'), "unsupported schema"),
        (lambda d: d.replace(b'"version":1', b'"version":"1"'), "wrong type"),
        (lambda d: d.replace(b'"version":1', b'"version":true'), "wrong type"),
        (lambda d: d[:-1] + b',"extra":1}', "unknown field"),
        (lambda d: d[:-1] + b',"repo":"x"}', "duplicate key"),
        (lambda d: d.replace(b'"ttl":300', b'"ttl":NaN'), "non-standard"),
        (lambda d: b" " + d, "canonical"),
        (lambda d: b"x" * (record.MAX_RECORD_BYTES + 1), "limit"),
        (lambda d: d.replace(b'["a","b/c"]', b'["a","a/b"]'), "minimal"),
        (lambda d: d.replace(b'["a","b/c"]', b'["../x"]'), "invalid path"),
        (lambda d: d.replace(b'["a","b/c"]', b"[]"), "1 to 1024"),
        (lambda d: b"[1,2]", "not a JSON object"),
        (lambda d: b"[" * 60000, "not JSON"),
    ],
)
def test_malformed(mutate, why):
    with pytest.raises(InvalidRecord) as err:
        record.parse(mutate(sample().canonical()))
    assert why in str(err.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids),
    max_leaves=20,
)


@given(json_values)
def test_fuzz_json_never_crashes(obj):
    try:
        record.parse(json.dumps(obj).encode())
    except InvalidRecord:
        pass


@given(st.binary(max_size=300))
def test_fuzz_bytes_never_crashes(data):
    try:
        record.parse(data)
    except InvalidRecord:
        pass


@given(
    st.dictionaries(
        st.sampled_from(
            ["version", "ttl", "leaseId", "owner", "scope", "expiresAt", "nonce", "renewEvery", "progress"]
        ),
        json_values,
        min_size=1,
        max_size=3,
    )
)
def test_fuzz_field_values(changes):
    doc = json.loads(sample().canonical())
    doc.update(changes)
    data = record.canonical(doc)
    try:
        rec = record.parse(data)
    except InvalidRecord:
        return
    assert rec.canonical() == data


def test_stop_by_is_written_carried_over_and_optional_for_old_records():
    """Issue 17: each version records its holder's stop deadline (``stopBy``); a record written before the field
    existed still parses, keeps its exact bytes, and its stop deadline is its expiry."""
    rec = sample(stop_after=40)
    assert rec.stop_by == "2027-01-15T08:00:40Z" and rec.stop_deadline == rec.renewed + 40 and rec.stop_after == 40
    nxt = rec.next_version(1_800_000_100.7)  # the horizon is carried over, from the renewal's whole second
    assert nxt.renewed_at == "2027-01-15T08:01:40Z" and nxt.stop_deadline - nxt.renewed == 40
    assert nxt.next_version(1_800_000_200, stop_after=70).stop_after == 70
    assert nxt.next_version(1_800_000_200, ttl=30).stop_after == 30  # never past the expiry
    assert sample().stop_deadline == sample().expires  # a holder that promises nothing: its TTL
    old = json.loads(rec.canonical())
    del old["stopBy"]
    data = record.canonical(old)
    parsed = record.parse(data)
    assert parsed.stop_by is None and parsed.stop_deadline == parsed.expires and parsed.canonical() == data
    assert parsed.next_version(1_800_000_100).stop_deadline == parsed.next_version(1_800_000_100).expires
    for bad in ("2027-01-15T07:59:59Z", "2027-01-15T08:05:01Z", "soon"):  # before renewedAt, after expiresAt
        with pytest.raises(InvalidRecord):
            record.parse(record.canonical(dict(old, stopBy=bad)))


# ---------------------------------------------------------- timestamps read once, by arithmetic, as strptime did


@given(st.integers(min_value=-30_610_224_000, max_value=253_402_300_799))
def test_parse_iso_inverts_iso_as_strptime_did(ts):
    from gitlease.core.clock import _parse_iso_strptime, iso, parse_iso

    text = iso(ts)
    assert parse_iso(text) == _parse_iso_strptime(text) == float(ts)


stamp_chars = st.sampled_from(list("0123456789-T:Z 1+٣"))


@given(
    st.one_of(
        st.text(stamp_chars, min_size=20, max_size=20),
        st.tuples(
            st.integers(0, 9_999), st.integers(0, 13), st.integers(0, 32), st.integers(0, 25), st.integers(0, 61)
        ).map(lambda t: f"{t[0]:04d}-{t[1]:02d}-{t[2]:02d}T{t[3]:02d}:{t[4]:02d}:{t[4] % 62:02d}Z"),
        st.sampled_from(
            ["2026-01- 1T00:00:00Z", "2026-1-01T00:00:00ZZ", "2024-02-29T23:59:59Z", "2023-02-29T00:00:00Z"]
        ),
    )
)
def test_parse_iso_answers_as_strptime(text):
    """The arithmetic reading agrees with strptime's on every string: the same value, or ValueError."""
    from gitlease.core.clock import _parse_iso_strptime, parse_iso

    want = "refused" if len(text) != 20 or not text.endswith("Z") else answer(_parse_iso_strptime, text)
    assert answer(parse_iso, text) == want


def test_record_timestamps_are_read_once_and_match_the_text():
    from gitlease.core.clock import parse_iso

    rec = record.parse(sample(ttl=600, stop_after=100).canonical())
    assert {"expires", "renewed", "stop_deadline"} <= set(vars(rec))  # filled in by validate
    assert rec.expires == parse_iso(rec.expires_at) and rec.renewed == parse_iso(rec.renewed_at)
    assert rec.stop_deadline == parse_iso(rec.stop_by)
    nxt = rec.next_version(rec.renewed + 50, ttl=900)
    assert nxt.expires == parse_iso(nxt.expires_at) == rec.renewed + 50 + 900
    assert nxt.stop_deadline == parse_iso(nxt.stop_by)
    assert nxt == record.parse(nxt.canonical())


def test_a_record_kept_as_fields_comes_back_equal_with_its_timestamps():
    from gitlease.core import record as records

    rec = records.new_record(
        lease_id="lease_0123456789ab",
        repo="r",
        paths=("a", "b/c"),
        workspace_id="w",
        owner=records.Owner("t", "a", "h", 7, 11, None),
        now=1_700_000_000.0,
        ttl=60,
    )
    rec = rec.next_version(now=1_700_000_010.0, ttl=90, progress=records.Progress("half", 3, "2023-11-14T22:13:30Z"))
    back = records.from_fields(records.to_fields(rec))
    assert back == rec and records.canonical(back.to_json()) == rec.canonical() and hash(back) == hash(rec)
    import dataclasses

    for kept, made in ((back, rec), (back.owner, rec.owner), (back.progress, rec.progress)):
        names = {f.name for f in dataclasses.fields(made)}
        assert names <= set(vars(kept)) and {k: vars(kept)[k] for k in names} == {k: vars(made)[k] for k in names}
    assert (back.expires, back.renewed, back.stop_deadline) == (rec.expires, rec.renewed, rec.stop_deadline)
    import marshal

    assert records.from_fields(marshal.loads(marshal.dumps(records.to_fields(rec)))) == rec
    for bad in [(), ("x",) * 19, records.to_fields(rec)[:18], (*records.to_fields(rec)[:16], 1, 2, 3)]:
        with pytest.raises(ValueError):
            records.from_fields(bad)
