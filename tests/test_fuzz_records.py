"""Fuzzing lease records at the text level: JSON escape tricks (lone surrogates, NUL, bidi controls, BOM),
duplicate keys, huge and odd numbers, white space, applied to a real canonical record. ``record.parse`` gives a
Record whose canonical bytes are the input, or InvalidRecord; a reader (``build_views``, ``git lease
can-start``) never crashes on one and keeps the scope it names blocked (zero grants)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import git
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitlease.core import record
from gitlease.core.clock import FakeClock
from gitlease.core.errors import InvalidRecord
from gitlease.core.objects import ObjectWriter, ident_for
from gitlease.core.record import Owner, new_record
from gitlease.core.refnames import scope_ref
from gitlease.core.store import Blob
from gitlease.service.views import Snapshot, build_views

CLOCK = FakeClock()
GOOD = new_record(
    lease_id="lease_0000000000aaaaaa",
    repo="r",
    paths=("svc",),
    workspace_id="w",
    owner=Owner(task_id="task", agent_id="agent", host="h", pid=0),
    now=CLOCK.now(),
    ttl=60,
)
DATA = GOOD.canonical()
STRINGS = [b'"task"', b'"agent"', b'"h"', b'"w"', b'"r"', b'"svc"']
NUMBERS = [b'"ttl":60', b'"version":1', b'"pid":0']

text_tricks = st.sampled_from(
    [
        b'"\\ud800"',
        b'"\\udfff\\ud800"',
        b'"a\\ud83d"',
        b'"\\ud83d\\ude00"',
        b'"\\u0000"',
        b'"\\u202e"',
        b'"\\ufeff"',
        b'"\\u00e9"',
        '"\u00e9"'.encode(),
        b'"\\/"',
        b'"\\n"',
        b'"a\\u0009b"',
        '"\u2028"'.encode(),
        b'""',
        b'"' + b"x" * 5000 + b'"',
        b"null",
        b"1",
        b"[]",
        b"{}",
        b'"\\x41"',
        b'"\\u00"',
        '"\U0001f600"'.encode(),
    ]
)
number_tricks = st.sampled_from(
    [
        b"9" * 400,
        b"9" * 5000,
        b"-0",
        b"0.0",
        b"6e1",
        b"1e999",
        b"-1",
        b"NaN",
        b"Infinity",
        b"true",
        b"60 ",
        b"060",
        b"0x3c",
        b"18446744073709551616",
        b'"60"',
    ]
)


@st.composite
def mutated(draw):
    data = DATA
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["string", "number", "duplicate", "space", "bom", "truncate"]))
        if kind == "string":
            old = draw(st.sampled_from(STRINGS))
            data = data.replace(old, draw(text_tricks), 1)
        elif kind == "number":
            old = draw(st.sampled_from(NUMBERS))
            key = old.split(b":")[0]
            data = data.replace(old, key + b":" + draw(number_tricks), 1)
        elif kind == "duplicate":
            key = draw(st.sampled_from([b'"version"', b'"leaseId"', b'"scope"', b'"agentId"', b'"VERSION"']))
            pos = draw(st.sampled_from([1, len(data) - 1]))
            entry = key + b':"x"'
            data = data[:pos] + (entry + b"," if pos == 1 else b"," + entry) + data[pos:]
        elif kind == "space":
            pos = draw(st.integers(0, len(data)))
            data = data[:pos] + draw(st.sampled_from([b" ", b"\n", b"\t", b"\r\n"])) + data[pos:]
        elif kind == "bom":
            data = b"\xef\xbb\xbf" + data
        else:
            data = data[: draw(st.integers(0, len(data)))]
    return data


@settings(max_examples=500, deadline=None)
@given(mutated())
def test_fuzz_record_text_parses_canonically_or_is_invalid(data):
    try:
        rec = record.parse(data)
    except InvalidRecord as exc:
        assert "\n" not in str(exc) and exc.exit_code == 5
        return
    assert rec.canonical() == data


def test_lone_surrogate_escapes_are_invalid_records():
    """Regression (found by fuzzing): ``"\\ud800"`` in a text field decoded, then crashed the canonical check
    with UnicodeEncodeError; one such record made every reader of the store fail."""
    for trick in (b'"\\ud800"', b'"\\udfff\\ud800"', b'"a\\ud83d"'):
        data = DATA.replace(b'"task"', trick, 1)
        try:
            record.parse(data)
        except InvalidRecord as exc:
            assert "surrogate" in str(exc)
        else:
            raise AssertionError("parsed")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_readers_keep_the_scope_blocked(data):
    oid = "1" * 40
    refs = {scope_ref("svc"): oid, "refs/leases/id/lease_0000000000aaaaaa": oid}
    views = build_views(refs, {oid: Blob(data, None, None)})
    snap = Snapshot(leases=views, fetched_at=CLOCK.now())
    assert snap.blocking(["svc/file"], CLOCK.now(), 30)
    for v in views:
        v.to_json(CLOCK.now(), 30)


def test_fuzz_records_through_the_real_cli(make_repo):
    """A sample of forged records on a real store: ``git lease can-start --scope svc --json`` says held (exit 3)
    with one JSON object, and ``status --json`` lists the lease, never a traceback."""
    repo = make_repo("store")
    gdir = git(repo, "rev-parse", "--absolute-git-dir").strip()
    writer = ObjectWriter(os.path.join(gdir, "objects"))
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])

    @settings(max_examples=4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(mutated())
    def prop(data):
        oid = writer.lease_commit(data, None, (), ident_for("forger", "h"), 1_800_000_000, "forged")
        for ref in (scope_ref("svc"), "refs/leases/id/lease_0000000000aaaaaa"):
            git(repo, "update-ref", ref, oid)
        res = subprocess.run(
            ["git", "lease", "can-start", "--scope", "svc", "--json"], cwd=repo, capture_output=True, text=True, env=env
        )
        assert "Traceback" not in res.stderr and res.returncode == 3, res.stderr
        assert json.loads(res.stdout)["error"]["kind"] == "held"
        res = subprocess.run(["git", "lease", "status", "--json"], cwd=repo, capture_output=True, text=True, env=env)
        assert "Traceback" not in res.stderr and res.returncode == 0, res.stderr
        # (an unreadable record's scope ref is listed on its own, as "?<oid>": it cannot name its lease)
        got = [v["leaseId"] for v in json.loads(res.stdout)["result"]["leases"]]
        assert "lease_0000000000aaaaaa" in got and len(got) <= 2, got

    prop()
