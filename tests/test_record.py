import json

import pytest
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
    for key in (
        "leaseId",
        "repo",
        "scope",
        "workspaceId",
        "owner",
        "status",
        "version",
        "acquiredAt",
        "expiresAt",
        "schema",
        "nonce",
    ):
        assert key in doc
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
