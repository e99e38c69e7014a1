"""Where hooks cannot be skipped: ``git lease verify`` in CI, and the server's pre-receive hook."""

import dataclasses
import json
import os

import pytest
from conftest import cli, git
from test_hooks import acquire, commit, run

from gitlease.core import record as records
from gitlease.core.objects import ObjectWriter, ident_for


def verify(repo, *args):
    res = cli(repo, "verify", "--json", *args)
    return res, json.loads(res.stdout)


def test_no_verify_commit_pushed_is_refused_by_verify(origin):
    agent = origin("agent")
    lease = acquire(agent, "services/billing")
    git(agent, "switch", "-q", "-c", "task")
    assert commit(agent, "services/billing/a.py", msg=f"billing\n\nLease: {lease}").returncode == 0
    assert commit(agent, "docs/x.md", msg=f"sneaky\n\nLease: {lease}", extra=("--no-verify",)).returncode == 0
    git(agent, "push", "-q", "--no-verify", "origin", "task")

    ci = origin("ci")
    git(ci, "switch", "-q", "task")
    res, env = verify(ci, "--base", "origin/main")
    assert res.returncode == 4 and not env["ok"] and env["error"]["kind"] == "scope-violation"
    details = env["error"]["details"]
    assert details["leases"] == [lease] and details["foundBy"] == "trailer" and details["commits"] == 2
    assert [v["path"] for v in details["violations"]] == ["docs/x.md"]
    res = cli(ci, "verify", "--base", "origin/main")
    assert res.returncode == 4
    assert res.stderr.splitlines()[:2] == [
        f"gitlease: verify refused (lease {lease} (from trailer)): 1 path outside the change's leases",
        "  docs/x.md: scope docs, not leased by this change",
    ]
    assert res.stderr.splitlines()[-1] == "git-lease: verify refused: 1 path may not be written by this change"
    # the clean part of the branch passes, naming the lease by flag
    res = cli(ci, "verify", "--base", "origin/main", "--head", "HEAD~1", "--lease", lease)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (f"verify ok: 1 path in 1 commit (origin/main..HEAD~1), lease {lease} (from flag)")


def test_verify_finds_the_lease_in_the_branch_name_and_checks_others(origin):
    a, b = origin("a"), origin("b")
    lease = acquire(a, "svc")
    theirs = acquire(b, "lib", agent="agent-b", task="task-b")
    git(a, "switch", "-q", "-c", f"agent/{lease}")
    assert commit(a, "svc/x", "lib/y", extra=("--no-verify",)).returncode == 0
    git(a, "push", "-q", "--no-verify", "origin", f"agent/{lease}")
    ci = origin("ci")
    git(ci, "switch", "-q", f"agent/{lease}")
    res, env = verify(ci, "--head", f"agent/{lease}")
    assert res.returncode == 4 and env["error"]["details"]["foundBy"] == "branch"
    (v,) = env["error"]["details"]["violations"]
    assert v["path"] == "lib/y" and v["holder"]["leaseId"] == theirs
    # a change that names no lease is checked against others' leases only (or refused with --require-lease)
    git(ci, "switch", "-q", "-c", "human", "origin/main")
    assert commit(ci, "free/z", extra=("--no-verify",)).returncode == 0
    res, env = verify(ci)
    assert res.returncode == 0 and env["result"]["mode"] == "others"
    res, env = verify(ci, "--require-lease")
    assert res.returncode == 2
    # a lease that is gone refuses (it must be active while CI checks the change)
    assert cli(a, "release", lease).returncode == 0
    res, env = verify(origin("ci2"), "--base", "origin/main", "--head", f"origin/agent/{lease}", "--lease", lease)
    assert res.returncode == 4 and f"lease {lease} is not on the lease store" in env["error"]["details"]["notes"]


def test_verify_fails_closed_when_store_unreachable(origin, tmp_path):
    ci = origin("ci")
    assert commit(ci, "x", extra=("--no-verify",)).returncode == 0
    res, env = verify(ci, "--remote", str(tmp_path / "nowhere.git"))
    assert res.returncode == 1 and env["error"]["kind"] == "remote-unavailable"
    res, env = verify(ci, "--base", "origin/nope")
    assert res.returncode == 2 and "fetch-depth" in env["error"]["message"]


# ------------------------------------------------------------------------------ pre-receive


@pytest.fixture
def guarded(origin):
    res = cli(origin.bare, "install-hooks", "--server")
    assert res.returncode == 0 and "pre-receive: installed" in res.stdout, res.stderr
    return origin


def test_pre_receive_lets_gitlease_work_and_refuses_others_paths(guarded):
    a, b = guarded("a"), guarded("b")
    lease = acquire(a, "svc", agent="agent-a", task="task-a")
    assert cli(a, "renew", lease).returncode == 0
    assert commit(b, "svc/f", extra=("--no-verify",)).returncode == 0
    res = run(b, "push", "--no-verify", "origin", "HEAD:main")
    assert res.returncode == 1 and "pre-receive hook declined" in res.stderr
    assert "remote: gitlease: push refused (server): 1 path inside leases held by others" in res.stderr
    assert "remote: gitlease:   svc/f: scope svc, held by another lease (task=task-a agent=agent-a" in res.stderr
    assert lease not in res.stderr  # no holder's lease id next to the instructions for claiming (issue 16)
    assert "on this unsigned store claims are not verified" in res.stderr
    # the holder pushes the same kind of change, naming its lease in a trailer (or -o lease=...)
    assert commit(a, "svc/g", msg=f"work\n\nLease: {lease}").returncode == 0
    assert run(a, "push", "-q", "origin", "HEAD:main").returncode == 0
    # or names it with a push option (the server must advertise them)
    git(guarded.bare, "config", "receive.advertisePushOptions", "true")
    assert commit(a, "svc/i").returncode == 0
    assert run(a, "push", "-q", "origin", "HEAD:main").returncode == 1
    assert run(a, "push", "-q", "-o", f"lease={lease}", "origin", "HEAD:main").returncode == 0
    git(b, "reset", "-q", "--hard", "HEAD~1")
    assert commit(b, "free/h").returncode == 0  # unleased paths pass
    git(b, "pull", "-q", "--rebase", "origin", "main")
    assert run(b, "push", "-q", "origin", "HEAD:main").returncode == 0
    assert cli(a, "release", lease).returncode == 0


def test_pre_receive_reads_the_leases_near_the_push_and_still_sees_a_torn_one(guarded):
    """The server hook reads only the leases bearing on the pushed paths and those the push claims
    (bearing.restrict_refs): a lease whose scope ref is gone but whose id ref is left still blocks its path, and
    a holder's claim is still honoured."""
    a, b = guarded("a"), guarded("b")
    acquire(a, "torn", agent="agent-a", task="task-a")
    mine = acquire(b, "mine", agent="agent-b", task="task-b")
    acquire(a, "elsewhere", agent="agent-a", task="task-c")
    git(guarded.bare, "update-ref", "-d", "refs/leases/scope/torn")  # only its id ref is left
    assert commit(b, "torn/f", extra=("--no-verify",)).returncode == 0
    res = run(b, "push", "--no-verify", "origin", "HEAD:main")
    assert res.returncode == 1 and "1 path inside leases held by others" in res.stderr, res.stderr
    git(b, "reset", "-q", "--hard", "HEAD~1")
    assert commit(b, "mine/f", msg=f"work\n\nLease: {mine}").returncode == 0
    assert run(b, "push", "-q", "origin", "HEAD:main").returncode == 0


def test_pre_receive_lets_parked_work_in_but_judges_it_when_it_reaches_a_branch(guarded):
    """refs/leases-quarantine/<task>/<attempt> (a failed attempt's work, parked by the queue runner) is not
    judged by its paths: nothing lands by it. The same commit pushed to a branch is refused as before."""
    a, b = guarded("a"), guarded("b")
    acquire(a, "svc", agent="agent-a", task="task-a")
    assert commit(b, "svc/f", extra=("--no-verify",)).returncode == 0
    res = run(b, "push", "--no-verify", "origin", "HEAD:refs/leases-quarantine/t1/1")
    assert res.returncode == 0, res.stderr
    res = run(b, "push", "--no-verify", "origin", "HEAD:refs/heads/main")
    assert res.returncode == 1 and "1 path inside leases held by others" in res.stderr, res.stderr


def _forge(repo, rec, parents=(), data=None):
    git_dir = git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir").strip()
    w = ObjectWriter(os.path.join(git_dir, "objects"))
    return w.lease_commit(
        data if data is not None else rec.canonical(),
        None,
        tuple(parents),
        ident_for("forger", "host"),
        1_800_000_000,
        "forged",
    )


def _push(repo, *specs, pins=()):
    args = ["push", "--porcelain", "--no-verify", "--atomic"]
    args += [f"--force-with-lease={ref}:{old}" for ref, old in pins]
    return run(repo, *args, "origin", *specs)


def test_pre_receive_refuses_improper_lease_versions(guarded):
    a = guarded("a")
    lease = acquire(a, "svc")
    git(a, "fetch", "-q", "origin", f"refs/leases/id/{lease}")
    v1 = git(a, "rev-parse", "FETCH_HEAD").strip()
    rec1 = records.parse(git(a, "cat-file", "blob", f"{v1}:lease.json").encode())
    ref = f"refs/leases/id/{lease}"
    v3 = _forge(a, dataclasses.replace(rec1, version=3, nonce="1" * 32), [v1])
    res = _push(a, f"{v3}:{ref}", pins=[(ref, v1)])
    assert res.returncode == 1 and "version 3 does not follow version 1" in res.stderr
    orphan = _forge(a, rec1.next_version(rec1.renewed + 1))
    res = _push(a, f"{orphan}:{ref}", pins=[(ref, v1)])
    assert "not a next version" in res.stderr
    moved = _forge(a, dataclasses.replace(rec1.next_version(rec1.renewed + 1), paths=("other",)), [v1])
    res = _push(a, f"{moved}:{ref}", pins=[(ref, v1)])
    assert "a renewal may not change paths" in res.stderr
    late = _forge(a, rec1.next_version(rec1.expires + 5), [v1])
    res = _push(a, f"{late}:{ref}", pins=[(ref, v1)])
    assert "after the lease expired" in res.stderr
    junk = _forge(a, rec1, [v1], data=rec1.canonical() + b" ")
    res = _push(a, f"{junk}:{ref}", pins=[(ref, v1)])
    assert "invalid record" in res.stderr
    res = _push(a, f"{v1}:refs/leases/scope/other", pins=[("refs/leases/scope/other", "")])
    assert "created without their lease's id ref" in res.stderr
    res = _push(a, f"{v1}:refs/leases/junk", pins=[("refs/leases/junk", "")])
    assert "not a gitlease ref" in res.stderr
    res = _push(a, f"{orphan}:refs/leases/scope/svc", pins=[("refs/leases/scope/svc", v1)])
    assert "scope refs never move" in res.stderr
    # nothing above landed; the real renewal still works
    assert git(guarded.bare, "rev-parse", ref).strip() == v1
    res = cli(a, "renew", lease)
    assert res.returncode == 0, res.stderr
    assert cli(a, "release", lease).returncode == 0
    assert git(guarded.bare, "for-each-ref", "refs/leases/") == ""


def test_server_hook_command_for_gitea_and_gitlab(origin):
    """``git lease server-hook pre-receive`` (what a Gitea/GitLab hook script calls) reads refs on stdin."""
    import subprocess
    import sys

    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    line = f"{'0' * 40} {'1' * 40} refs/leases/junk\n"
    res = subprocess.run(
        ["git", "lease", "server-hook", "pre-receive"],
        cwd=origin.bare,
        input=line,
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 4
    assert res.stderr.splitlines() == [
        "gitlease: refs/leases/junk: not a gitlease ref (only refs/leases/id/<lease>, refs/leases/scope[/<path>], "
        "refs/leases/task/<task>, refs/leases/outcome/<task>, refs/leases/doctor/..., refs/leases/verdict/<server> "
        "and refs/leases-audit/<writer> live here)",
        "git-lease: push refused by the lease server hook (1 problem)",
    ]
    res = subprocess.run(
        ["git", "lease", "server-hook", "pre-receive", "--json"],
        cwd=origin.bare,
        input="",
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 0 and json.loads(res.stdout)["ok"]


def test_reserved_probe_refs_pass_the_server_hook_only_in_doctors_shape(origin, monkeypatch):
    """Doctor's probe refs (refs/leases/doctor/) pass the server hook when they are doctor's own shape (a
    parentless commit holding only doctor.txt); nothing else may be parked there (issue 16, item 2)."""
    from gitlease.core.objects import PROBE_FILE, PROBE_MAGIC
    from gitlease.enforce import server as receive

    w = ObjectWriter(os.path.join(origin.bare, "objects"))
    probe = w.commit(w.tree({PROBE_FILE: w.blob(PROBE_MAGIC + b"x\n")}), (), "d <d@x>", 1_800_000_000, "probe")
    parked = git(origin.bare, "rev-parse", "main").strip()
    monkeypatch.chdir(origin.bare)
    ref = "refs/leases/doctor/20261202T000000Z-cafe/x"
    assert receive.check_lease_updates([("0" * 40, probe, ref)]) == []
    (why,) = receive.check_lease_updates([("0" * 40, parked, ref)])
    assert "not a doctor probe" in why
    assert receive.check_lease_updates([("0" * 40, "1" * 40, ref)]) != []
    assert receive.check_lease_updates([(probe, "0" * 40, ref)]) == []  # doctor deletes its probes


def _trust_two_agents(guarded, tmp_path):
    """Keys for agent-a and agent-b (in tmp_path), both trusted by the trust file pushed to the store's main."""
    from gitlease.identity import sshsig

    keys = {n: sshsig.generate_key(str(tmp_path / f"key_{n}"), comment=n) for n in ("agent-a", "agent-b")}
    admin = guarded("trust-admin")
    (admin / ".gitlease").mkdir()
    (admin / ".gitlease" / "allowed_signers").write_text(
        "".join(f'{n} namespaces="gitlease" {k.public_key()}\n' for n, k in keys.items())
    )
    git(admin, "add", ".gitlease/allowed_signers")
    git(admin, "commit", "-q", "-m", "trust")
    git(admin, "push", "-q", "origin", "HEAD:main")
    return keys


def test_pre_receive_verifies_signatures_against_the_servers_trust_file(guarded, tmp_path):
    from gitlease.identity import sshsig

    keys = _trust_two_agents(guarded, tmp_path)
    a, b, eve = guarded("a"), guarded("b"), guarded("eve")
    for repo, who in ((a, "agent-a"), (b, "agent-b")):
        git(repo, "config", "lease.signingKey", str(tmp_path / f"key_{who}"))
        git(repo, "config", "lease.agent", who)
    res = cli(a, "acquire", "--scope", "svc", "--json")  # signed and trusted: accepted
    assert res.returncode == 0, res.stderr
    lease = json.loads(res.stdout)["result"]["leaseId"]
    assert cli(a, "renew", lease).returncode == 0
    res = cli(eve, "acquire", "--scope", "other", "--agent", "eve")  # unsigned on a signed server
    assert res.returncode == 1 and "unsigned, but this store is signed" in res.stderr
    # agent B (trusted too) writes the next version of A's lease, signed with B's key: a valid CAS, refused
    ref = f"refs/leases/id/{lease}"
    git(b, "fetch", "-q", "origin", ref)
    cur = git(b, "rev-parse", "FETCH_HEAD").strip()
    rec = records.parse(git(b, "cat-file", "blob", f"{cur}:lease.json").encode())
    nxt = rec.next_version(rec.renewed + 1)
    data = nxt.canonical()
    forged = ObjectWriter(os.path.join(git(b, "rev-parse", "--absolute-git-dir").strip(), "objects")).lease_commit(
        data,
        sshsig.sign(keys["agent-b"], data, "gitlease").encode(),
        (cur,),
        ident_for("agent-b", "h"),
        1_800_000_000,
        "x",
    )
    res = _push(b, f"{forged}:{ref}", pins=[(ref, cur)])
    assert res.returncode == 1 and "not by the owner key" in res.stderr
    assert git(guarded.bare, "rev-parse", ref).strip() == cur
    assert cli(a, "release", lease).returncode == 0


def _svc(repo, agent):
    from gitlease import open_service

    return open_service(str(repo), agent=agent, task=f"task-{agent}")


def _land_and_release(svc, lease, *, entry=True, oid=None):
    """One atomic push: the branch at this worktree's HEAD, and ``lease``'s release as the landing train sends it
    (its refs' deletes and, unless ``entry`` is False, the holder's audit entry; ``oid``: the version the entry
    says it releases, when not the one deleted). The renew lock is let go after."""
    prep = svc.prepare_release(lease)
    try:
        fields = dict(prep.fields, oid=oid or prep.fields["oid"])
        audits = [svc.audit.prepare_entries([(fields, prep.pointer)])[0]] if entry else []
        head = git(svc.repo.cwd, "rev-parse", "HEAD").strip()
        return svc.store.apply(prep.updates + audits, extra_refspecs=[f"{head}:refs/heads/main"])
    finally:
        prep.close()


def test_pre_receive_takes_a_holders_release_as_the_landing_pushs_claim(guarded):
    """The landing train lands a task's commit and gives its lease back in one push: the release (its refs
    deleted at the version held, with the holder's audit entry of exactly that version) claims the lease for
    the commit, as a renewal would. Without the entry, or with one for another version, the push is refused:
    a push that deletes leases carries other refs only as such a release."""
    a = guarded("a")
    svc = _svc(a, "agent-a")
    got = svc.acquire(["svc"], ttl=300)
    lease = got.lease_id
    assert commit(a, "svc/f", extra=("--no-verify",)).returncode == 0
    out = _land_and_release(svc, lease, entry=False)
    assert not out.ok and "only when each lease it deletes is released in it by its holder" in out.message
    out = _land_and_release(svc, lease, oid=got.oid[::-1])  # an entry for a version that is not the one deleted
    assert not out.ok and "only when each lease it deletes is released in it by its holder" in out.message
    assert git(guarded.bare, "rev-parse", f"refs/leases/id/{lease}").strip() == got.oid  # nothing landed
    out = _land_and_release(svc, lease)
    assert out.ok, out.message
    assert git(guarded.bare, "log", "-1", "--format=%s", "main").strip() == "change"
    assert run(guarded.bare, "rev-parse", "-q", "--verify", f"refs/leases/id/{lease}").returncode == 1
    log = cli(a, "log", "--lease", lease, "--json")
    assert log.returncode == 0 and "audit" in [e.get("source") for e in json.loads(log.stdout)["result"]["events"]]


def test_pre_receive_a_release_claims_only_its_own_lease(guarded):
    """A holder that releases its own lease in a push cannot land, with it, a commit touching another's lease."""
    a, b = guarded("a"), guarded("b")
    acquire(a, "svc", agent="agent-a", task="task-a")
    svc = _svc(b, "agent-b")
    mine = svc.acquire(["other"], ttl=300).lease_id
    assert commit(b, "svc/f", "other/g", extra=("--no-verify",)).returncode == 0
    out = _land_and_release(svc, mine)
    assert not out.ok and "inside leases held by others" in out.message, out.message
    assert run(guarded.bare, "rev-parse", "-q", "--verify", f"refs/leases/id/{mine}").returncode == 0


def test_pre_receive_a_release_by_another_trusted_key_claims_nothing(guarded, tmp_path):
    """On a signed store the release that claims a lease must be recorded under the lease owner's key: agent B
    (trusted too) deleting A's lease with a release entry of its own, to land into A's scope, is refused."""
    from gitlease.core.refnames import id_ref, scope_ref
    from gitlease.core.store import RefUpdate

    _trust_two_agents(guarded, tmp_path)
    a, b = guarded("a"), guarded("b")
    for repo, who in ((a, "agent-a"), (b, "agent-b")):
        git(repo, "config", "lease.signingKey", str(tmp_path / f"key_{who}"))
        git(repo, "config", "lease.agent", who)
    got = _svc(a, "agent-a").acquire(["svc"], ttl=300)
    svc = _svc(b, "agent-b")
    git(b, "pull", "-q", "origin", "main")
    assert commit(b, "svc/f", extra=("--no-verify",)).returncode == 0
    refs = {id_ref(got.lease_id): got.oid, scope_ref("svc"): got.oid}
    fields = {"action": "release", "rule": None, "reason": "released by its holder", "by": "agent-b",
              "leaseId": got.lease_id, "version": 1, "oid": got.oid, "grant": got.oid, "refs": refs,
              "paths": ["svc"], "valid": True}  # fmt: skip
    entry, _after = svc.audit.prepare_entries([(fields, None)])
    head = git(b, "rev-parse", "HEAD").strip()
    out = svc.store.apply(
        [RefUpdate(r, None, o) for r, o in refs.items()] + [entry], extra_refspecs=[f"{head}:refs/heads/main"]
    )
    assert not out.ok and "only when each lease it deletes is released in it by its holder" in out.message
    assert git(guarded.bare, "rev-parse", id_ref(got.lease_id)).strip() == got.oid
