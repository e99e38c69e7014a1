"""Ref names every host accepts: every name gitlease writes is within gitolite's default ref-name rule (the
strictest measured: no ``%``), names of earlier versions (``%XX`` escapes) are still read, and the encoding
stays injective and keeps segment-prefix overlap as git's directory/file rule."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import cli, git
from hypothesis import given
from hypothesis import strategies as st

from gitlease.core import refnames, scope
from gitlease.core.errors import ScopeError
from gitlease.service.audit import audit_ref, writer_id

# gitolite 3.6's default rule for a ref name (src/lib/Gitolite/Rc.pm, $REF_OR_FILENAME_PATT): a push to any
# other name is refused with "invalid characters in ref or filename".
GITOLITE_REF = re.compile(r"^[0-9a-zA-Z][-0-9a-zA-Z._@/+ :,]*$")

segment = st.text(min_size=1, max_size=30).filter(lambda s: "/" not in s)


def _normalised(raw: str) -> str | None:
    try:
        return scope.normalize(raw)
    except ScopeError:
        return None


@given(segment)
def test_every_component_is_within_the_strictest_hosts_alphabet(seg):
    enc = refnames.encode_segment(seg)
    assert "%" not in enc and re.fullmatch(r"[A-Za-z0-9._+-]+", enc), enc
    assert refnames.decode_segment(enc) == seg


@given(st.lists(segment, min_size=1, max_size=4), segment, st.integers(1, 99))
def test_every_ref_name_gitlease_writes_passes_gitolites_rule(segs, task, attempt):
    path = _normalised("/".join(segs))
    names = [
        refnames.task_ref(task),
        refnames.outcome_ref(task),
        refnames.quarantine_ref(task, attempt),
        audit_ref(writer_id(task)),
    ]
    if path is not None:
        names.append(refnames.scope_ref(path))
    for name in names:
        assert GITOLITE_REF.match(name), name


@given(segment)
def test_names_of_earlier_versions_are_still_read_and_never_mistaken_for_new_ones(seg):
    new, old = refnames.encode_segment(seg), refnames.legacy_segment(seg)
    assert refnames.decode_segment(old) == seg
    assert "+" not in old and "%" not in new
    assert (new == old) == ("+" not in new)  # a name that needs no escape is the same in both


@given(st.text(st.sampled_from(list("aZ09-_.%+2EC3@ü")), max_size=10))
def test_a_component_decodes_in_one_form_only(component):
    """No component is canonical in both forms with different meanings: decoding is a function of the name,
    and a name mixing both escapes is refused."""
    try:
        seg = refnames.decode_segment(component)
    except ValueError:
        return
    assert component in (refnames.encode_segment(seg), refnames.legacy_segment(seg))
    assert not ("%" in component and "+" in component)


def test_prefix_refs_name_both_forms_of_a_scope_that_needs_an_escape():
    got = refnames.prefix_refs(".github/work flows/ci.yml")
    assert got == [
        ("refs/leases/scope", "."),
        ("refs/leases/scope/+2Egithub", ".github"),
        ("refs/leases/scope/%2Egithub", ".github"),
        ("refs/leases/scope/+2Egithub/work+20flows", ".github/work flows"),
        ("refs/leases/scope/%2Egithub/work%20flows", ".github/work flows"),
        ("refs/leases/scope/+2Egithub/work+20flows/ci.yml", ".github/work flows/ci.yml"),
        ("refs/leases/scope/%2Egithub/work%20flows/ci.yml", ".github/work flows/ci.yml"),
    ]
    assert refnames.prefix_refs("src/a.py") == [
        ("refs/leases/scope", "."),
        ("refs/leases/scope/src", "src"),
        ("refs/leases/scope/src/a.py", "src/a.py"),
    ]
    for ref, path in got:
        assert refnames.path_of_scope_ref(ref) == path
    assert refnames.legacy_scope_ref(".github/x") == "refs/leases/scope/%2Egithub/x"


def test_agent_ids_name_audit_refs_without_a_percent_sign():
    assert audit_ref(writer_id("alice@build-3")) == "refs/leases-audit/alice+40build-3"
    assert refnames.task_ref("fix ui") == "refs/leases/task/fix+20ui"


def test_the_new_names_are_valid_ref_names():
    tricky = [".hidden", "a.lock", "x..y", "end.", "@", "a@{b", "sp ace", "100%", "1+1", "ünï", "...", "%2E"]
    names = [refnames.scope_ref(s) for s in tricky]
    for name in names:
        res = subprocess.run(["git", "check-ref-format", name], capture_output=True)
        assert res.returncode == 0, name
        assert GITOLITE_REF.match(name), name
    assert len(set(names)) == len(names)


# ------------------------------------------------------------- a store written by an earlier version (%XX)


def _as_an_earlier_version_named_them(bare) -> list[str]:
    """Rename every ref written with ``+XX`` escapes to the ``%XX`` name an earlier version gave it (the objects
    are the same: a record names paths, never refs)."""
    renamed = []
    for line in git(bare, "for-each-ref", "--format=%(objectname) %(refname)").splitlines():
        oid, ref = line.split()
        if "+" in ref:
            git(bare, "update-ref", ref.replace("+", "%"), oid)
            git(bare, "update-ref", "-d", ref)
            renamed.append(ref.replace("+", "%"))
    return renamed


def test_a_lease_written_by_an_earlier_version_still_blocks_shows_and_releases(remote_file, make_repo):
    holder, other = make_repo("holder"), make_repo("other")
    url = remote_file.url
    res = cli(holder, "acquire", "--remote", url, "--agent", "ci@build-1", "--scope", ".github/work flows")
    assert res.returncode == 0, res.stderr
    lease_id = res.stdout.split()[2]
    legacy = _as_an_earlier_version_named_them(remote_file.path)
    assert "refs/leases/scope/%2Egithub/work%20flows" in legacy
    # git's directory/file rule cannot see the overlap (the names differ): the acquire looks after its grant
    for wanted in (".github", ".github/work flows/ci.yml"):
        res = cli(other, "acquire", "--remote", url, "--scope", wanted)
        assert res.returncode == 3, (wanted, res.stdout + res.stderr)
        assert lease_id in res.stderr and "ci@build-1" in res.stderr
    assert git(remote_file.path, "for-each-ref", "--format=%(refname)", "refs/leases/").split() == [
        f"refs/leases/id/{lease_id}",
        "refs/leases/scope/%2Egithub/work%20flows",
    ]  # the refused grants were taken back
    assert cli(other, "acquire", "--remote", url, "--scope", ".github/other").returncode == 0  # disjoint
    res = cli(other, "status", "--remote", url, "--json")
    assert res.returncode == 0, res.stderr
    leases = {v["leaseId"]: v for v in json.loads(res.stdout)["result"]["leases"]}
    assert leases[lease_id]["paths"] == [".github/work flows"] and leases[lease_id]["state"] == "active"
    res = cli(holder, "release", "--remote", url, lease_id)
    assert res.returncode == 0, res.stderr
    refs = git(remote_file.path, "for-each-ref", "--format=%(refname)", "refs/leases/").split()
    assert not any("%" in r for r in refs) and not any(lease_id in r for r in refs)
    audit = git(remote_file.path, "for-each-ref", "--format=%(refname)", "refs/leases-audit/").split()
    assert len(audit) == 1 and "+40" in audit[0]  # the releaser's agent id, user@host: no '%' in its name


# ------------------------------------------------- a server applying gitolite's default ref-name rule


GITOLITE_HOOK = """#!/bin/sh
# gitolite's default rule for ref names ($REF_OR_FILENAME_PATT), applied to every ref a push updates
export LC_ALL=C
while read old new ref; do
  printf '%s\\n' "$ref" >> "{log}"
  if ! printf '%s\\n' "$ref" | grep -Eq '^[0-9a-zA-Z][-0-9a-zA-Z._@/+ :,]*$'; then
    echo "invalid characters in ref or filename: '$ref'" >&2
    exit 1
  fi
done
"""


def test_every_ref_name_gitlease_writes_is_accepted_by_gitolites_rule(tmp_path):
    """Leases on paths that need escapes, releases and a reclaim (audit refs named after agent ids like
    user@host), a queue run whose task id needs escapes (task, outcome and quarantine refs), and doctor (its
    probes and its verdict), all against a remote whose hook refuses what gitolite refuses."""
    from test_work import AGENT

    from gitlease.core.clock import FakeClock
    from gitlease.service.factory import open_service
    from testing.servers import make_bare

    bare = make_bare(tmp_path / "remote.git")
    log = tmp_path / "refs.log"
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(GITOLITE_HOOK.replace("{log}", str(log)))
    hook.chmod(0o755)
    seed = tmp_path / "seed"
    git(tmp_path, "clone", "-q", str(bare), str(seed))
    (seed / "src").mkdir()
    (seed / "src" / "a b.py").write_text("x\n")
    git(seed, "add", "-A")
    git(seed, "commit", "-q", "-m", "init")
    git(seed, "push", "-q", "origin", "HEAD:main")
    git(seed, "config", "lease.remote", "origin")
    git(seed, "config", "lease.agent", "ci user@build-1")
    for wanted in (".github/work flows", "ünï/x+y", "src/a b.py"):
        res = cli(seed, "acquire", "--scope", wanted)
        assert res.returncode == 0, res.stderr
        assert cli(seed, "release", res.stdout.split()[2]).returncode == 0
    clock = FakeClock()
    gone = open_service(str(seed), clock=clock, agent="agent@host-a")
    gone.acquire([".hidden"], ttl=10)
    clock.advance(3600)
    taker = open_service(str(seed), clock=clock, agent="agent@host-b")
    assert taker.acquire([".hidden"], ttl=10).cleared  # reclaimed, audited
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    queue = tmp_path / "queue.jsonl"
    queue.write_text(json.dumps({"id": "fix ui@1", "paths": ["src/a b.py"]}) + "\n")
    refuse_first = 'test "$GITLEASE_ATTEMPT" != 1'  # the first attempt's work is refused: parked in quarantine
    flags = ["--land", "main", "--attempts", "2", "--backoff", "0", "--verify", refuse_first]
    res = cli(seed, "work", str(queue), *flags, "--", sys.executable, str(agent), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    res = cli(seed, "doctor", "--json", "--rounds", "2", timeout=180)
    assert json.loads(res.stdout)["ok"], res.stdout
    names = set(log.read_text().split("\n")) - {""}
    assert all(GITOLITE_REF.match(n) for n in names)
    want = [
        "refs/leases/scope/+2Egithub/work+20flows",
        "refs/leases/scope/+C3+BCn+C3+AF/x+2By",
        "refs/leases/scope/src/a+20b.py",
        "refs/leases-audit/ci+20user+40build-1",
        "refs/leases-audit/agent+40host-b",
        "refs/leases/task/fix+20ui+401",
        "refs/leases/outcome/fix+20ui+401",
        "refs/leases-quarantine/fix+20ui+401/1",
    ]
    assert [w for w in want if w not in names] == []
    assert any(n.startswith("refs/leases/verdict/") for n in names)
    assert any(n.startswith("refs/leases/doctor/") and "/names/+2Egithub/" in n for n in names)


def test_outcomes_and_audit_logs_named_by_an_earlier_version_are_read_and_continued(make_repo):
    from gitlease.service.factory import open_service
    from gitlease.service.outcomes import Outcomes

    work = make_repo()
    git(work, "config", "lease.remote", "local")
    svc = open_service(str(work), agent="ci@build-1")
    first = Outcomes(svc).write("fix ui", "retrying", 1, parent=None, reason="flaky")
    assert first is not None
    renamed = _as_an_earlier_version_named_them(work / ".git")
    assert renamed == ["refs/leases/outcome/fix%20ui"]
    outcomes = Outcomes(svc)
    got = outcomes.read(svc.store.list_refs())
    assert got["fix ui"].state == "retrying" and got["fix ui"].oid == first.oid
    # the next outcome goes on top of it, under the name it has (a create under the new name would leave two)
    assert outcomes.write("fix ui", "done", 2, parent=first.oid) is not None
    refs = git(work, "for-each-ref", "--format=%(refname)", "refs/leases/outcome/").split()
    assert refs == ["refs/leases/outcome/fix%20ui"]
    assert Outcomes(svc).read(svc.store.list_refs())["fix ui"].state == "done"
    # an audit log under an earlier version's name is read by git lease log
    lease = svc.acquire(["src"], ttl=60)
    svc.release(lease.lease_id)
    assert _as_an_earlier_version_named_them(work / ".git") == ["refs/leases-audit/ci%40build-1"]
    res = cli(work, "log", "--json")
    assert res.returncode == 0, res.stderr
    audited = [e for e in json.loads(res.stdout)["result"]["events"] if e["source"] == "audit"]
    assert [(e["event"], e["problem"]) for e in audited] == [("release", None)]
    assert "writer=ci+40build-1" in audited[0]["detail"]
