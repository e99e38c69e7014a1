"""``git lease trust add | remove | list``: one file per signer on the default branch, pushed with retries, so
that hosts joining at the same time never conflict."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import cli, git
from test_init import _clone

from gitlease.identity import sshsig

HOSTS = 5


def _seeded_remote(tmp_path) -> Path:
    """A bare remote whose main has one commit."""
    return _clone(tmp_path)[0]


def _host(tmp_path, bare, name: str) -> tuple[Path, sshsig.SigningKey]:
    """A clone on 'host' ``name`` with its own key, leasing through origin as agent-<name>."""
    work = tmp_path / name
    git(tmp_path, "clone", "-q", str(bare), str(work))
    key = sshsig.generate_key(str(tmp_path / f"key_{name}"), comment=name)
    for k, v in (("lease.remote", "origin"), ("lease.signingKey", key.path), ("lease.agent", f"agent-{name}")):
        git(work, "config", k, v)
    return work, key


BARRIER_HOOK = """#!/bin/sh
# the first {n} pushes wait for each other here, before any ref is locked: they all read the same commit of
# main, and all but one must lose the update and try again
cat >/dev/null
d="{d}"
if mkdir "$d/round-$$" 2>/dev/null && [ "$(ls "$d" | wc -l)" -le {n} ]; then
  while [ "$(ls "$d" | wc -l)" -lt {n} ]; do sleep 0.02; done
fi
exit 0
"""


def test_five_hosts_join_at_once_and_nothing_conflicts(tmp_path):
    bare = _seeded_remote(tmp_path)
    arrivals = tmp_path / "arrivals"
    arrivals.mkdir()
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(BARRIER_HOOK.format(n=HOSTS, d=arrivals))
    hook.chmod(0o755)
    hosts = [_host(tmp_path, bare, f"host-{i}") for i in range(HOSTS)]
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    procs = [
        subprocess.Popen(
            ["git", "lease", "trust", "add", work.name, "--json"],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for work, _ in hosts
    ]
    results = [p.communicate(timeout=120) for p in procs]
    docs = []
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        docs.append(json.loads(out)["result"])
    assert {d["action"] for d in docs} == {"added"}
    assert sum(d["attempts"] for d in docs) >= 2 * HOSTS - 1  # the barrier made all but one retry at least once
    assert len(os.listdir(arrivals)) >= HOSTS
    # every host's file is on main, each in a commit of its own on top of the other: no merge, nothing lost
    names = git(bare, "ls-tree", "--name-only", "main", ".gitlease/signers/").split()
    assert names == [f".gitlease/signers/host-{i}.pub" for i in range(HOSTS)]
    assert git(bare, "rev-list", "--merges", "main") == ""
    assert len(git(bare, "rev-list", "main").split()) == HOSTS + 1
    for work, key in hosts:
        line = git(bare, "show", f"main:.gitlease/signers/{work.name}.pub").strip()
        assert line == f'agent-{work.name} namespaces="gitlease" {key.public_key()}'
    # and every host's agent is trusted by every reader
    hook.unlink()
    leases = [json.loads(cli(w, "acquire", "--scope", w.name, "--json").stdout)["result"]["leaseId"] for w, _ in hosts]
    status = json.loads(cli(hosts[0][0], "status", "--json").stdout)["result"]
    assert status["signed"] and {v["leaseId"]: v["verification"] for v in status["leases"]} == dict.fromkeys(
        leases, "verified"
    )
    listed = json.loads(cli(hosts[0][0], "trust", "list", "--json").stdout)["result"]
    assert sorted(s["file"] for s in listed["signers"]) == names


def test_add_twice_is_unchanged_and_remove_revokes(tmp_path):
    bare = _seeded_remote(tmp_path)
    work, key = _host(tmp_path, bare, "host-a")
    res = cli(work, "trust", "add", "host-a", "--agents", "agent-host-a,helper-*")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("signer host-a: added to main of origin (.gitlease/signers/host-a.pub, commit ")
    assert f"trusts: agent-host-a,helper-* with key {key.fingerprint()}" in res.stdout
    assert git(bare, "show", "main:.gitlease/signers/host-a.pub") == (
        f'agent-host-a,helper-* namespaces="gitlease" {key.public_key()}\n'
    )
    again = cli(work, "trust", "add", "host-a", "--agents", "agent-host-a,helper-*")
    assert again.returncode == 0 and "unchanged on main of origin" in again.stdout and "already trusted" in again.stdout
    # the same key with other agents: its line is replaced, not doubled
    cli(work, "trust", "add", "host-a")
    assert git(bare, "show", "main:.gitlease/signers/host-a.pub").splitlines() == [
        f'agent-host-a namespaces="gitlease" {key.public_key()}'
    ]
    lease = json.loads(cli(work, "acquire", "--scope", "src", "--json").stdout)["result"]["leaseId"]
    listed = cli(work, "trust", "list")
    assert listed.stdout.splitlines()[0].startswith("signed: trust from .gitlease/signers/ (1 file) on main")
    assert f".gitlease/signers/host-a.pub: agent-host-a  {key.fingerprint()}  (gitlease)" in listed.stdout
    gone = cli(work, "trust", "remove", "host-a")
    assert gone.returncode == 0 and "signer host-a: removed from main of origin" in gone.stdout, gone.stderr
    assert "release --force" in gone.stdout
    assert git(bare, "ls-tree", "main", ".gitlease/signers/") == ""
    show = cli(work, "show", lease)
    assert show.returncode == 5  # no longer trusted: invalid, its scope stays blocked
    twice = cli(work, "trust", "remove", "host-a")
    assert twice.returncode == 2 and "no signer file .gitlease/signers/host-a.pub on main of origin" in twice.stderr


def test_no_push_writes_the_file_in_the_work_tree_for_review(tmp_path):
    bare = _seeded_remote(tmp_path)
    work, key = _host(tmp_path, bare, "host-b")
    res = cli(work, "trust", "add", "host-b", "--no-push", "--admin")
    assert res.returncode == 0, res.stderr
    assert "written to the work tree" in res.stdout and "next: git add -A .gitlease/signers/host-b.pub" in res.stdout
    text = (work / ".gitlease" / "signers" / "host-b.pub").read_text()
    assert text == f'agent-host-b namespaces="gitlease,gitlease-admin" {key.public_key()}\n'
    assert git(bare, "ls-tree", "main", ".gitlease/") == ""  # nothing pushed


def test_a_push_the_server_refuses_is_one_line_naming_the_way_through_review(tmp_path):
    bare = _seeded_remote(tmp_path)
    hook = bare / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'protected branch: open a pull request' >&2\nexit 1\n")
    hook.chmod(0o755)
    work, _ = _host(tmp_path, bare, "host-c")
    res = cli(work, "trust", "add", "host-c")
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("\n") == 1 and "protected branch: open a pull request" in res.stderr
    assert "--no-push" in res.stderr and "Traceback" not in res.stderr
    assert not (work / ".gitlease").exists()


def test_bad_names_and_a_missing_key_are_usage_errors(tmp_path):
    bare = _seeded_remote(tmp_path)
    work, _ = _host(tmp_path, bare, "host-d")
    for bad in ("../x", "a/b", "x.pub", "-x"):
        res = cli(work, "trust", "add", bad, "--json")
        assert res.returncode == 2, (bad, res.stderr)
    git(work, "config", "--unset", "lease.signingKey")
    res = cli(work, "trust", "add", "host-d")
    assert res.returncode == 2 and "no key: pass --key" in res.stderr
