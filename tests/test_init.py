"""``git lease init``: idempotent, and ``--yes`` in a fresh clone leaves a working, signed, enforced set-up."""

import json
import subprocess

from conftest import cli, git
from servers import make_bare


def _clone(tmp_path):
    bare = make_bare(tmp_path / "origin.git")
    seed = tmp_path / "seed"
    git(tmp_path, "init", "-q", str(seed))
    (seed / "README").write_text("x\n")
    git(seed, "add", "README")
    git(seed, "commit", "-q", "-m", "init")
    git(seed, "push", "-q", str(bare), "HEAD:refs/heads/main")
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(bare), str(work))
    return bare, work


def test_init_twice_changes_nothing_the_second_time(tmp_path, isolated_git):
    bare, work = _clone(tmp_path)
    first = cli(work, "init", "--remote", "origin", "--agent", "agent-7", "--yes", "--json")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)["result"]
    assert doc["changed"] and {s["name"]: s["status"] for s in doc["steps"]} == {
        "remote": "set",
        "agent": "set",
        "key": "set",
        "trust": "set",
        "hooks": "set",
        "ci": "skipped",
    }
    assert (isolated_git / ".ssh" / "gitlease_agent-7").exists()
    config = git(work, "config", "--get-regexp", r"^lease\.")
    assert "lease.remote origin" in config and "lease.agent agent-7" in config and "lease.signingkey" in config
    trust = (work / ".gitlease" / "allowed_signers").read_text()
    assert trust.startswith('agent-7 namespaces="gitlease" ssh-ed25519 ')
    hooks = sorted(p.name for p in (work / ".git" / "hooks").iterdir() if not p.name.endswith(".sample"))
    second = cli(work, "init", "--remote", "origin", "--agent", "agent-7", "--yes", "--json")
    doc2 = json.loads(second.stdout)["result"]
    assert second.returncode == 0 and not doc2["changed"]
    assert {s["status"] for s in doc2["steps"]} <= {"unchanged", "skipped"}
    assert (work / ".gitlease" / "allowed_signers").read_text() == trust
    assert sorted(p.name for p in (work / ".git" / "hooks").iterdir() if not p.name.endswith(".sample")) == hooks
    assert "nothing to change" in cli(work, "init").stdout


def test_init_yes_in_a_fresh_clone_leaves_a_working_setup(tmp_path):
    bare, work = _clone(tmp_path)
    assert cli(work, "init", "--remote", "origin", "--agent", "agent-7", "--yes").returncode == 0
    # the one thing only the user can do: put the trust-file line on the default branch (through review)
    git(work, "add", ".gitlease/allowed_signers")
    git(work, "commit", "-q", "-m", "trust agent-7")
    git(work, "push", "-q", "origin", "HEAD:main")
    res = cli(work, "acquire", "--scope", "src", "--json")
    assert res.returncode == 0, res.stderr
    lease = json.loads(res.stdout)["result"]["leaseId"]
    status = cli(work, "status")
    assert status.stdout.startswith("signed: trust from .gitlease/allowed_signers on main") and lease in status.stdout
    (work / "src").mkdir()
    (work / "src" / "a.py").write_text("print(1)\n")
    (work / "docs.md").write_text("no\n")
    git(work, "add", "src/a.py", "docs.md")
    refused = subprocess.run(["git", "commit", "-q", "-m", "both"], cwd=work, capture_output=True, text=True)
    assert refused.returncode != 0 and "docs.md" in refused.stderr  # the hook: outside the lease
    git(work, "reset", "-q", "docs.md")
    git(work, "commit", "-q", "-m", "inside the lease")
    git(work, "push", "-q", "origin", "HEAD:main")  # pre-push checks it against the store
    assert cli(work, "release", lease).returncode == 0
    assert git(bare, "for-each-ref", "refs/leases/") == ""


def test_init_refuses_an_unknown_remote_name_and_both_store_flags(tmp_path):
    bare, work = _clone(tmp_path)
    res = cli(work, "init", "--remote", "nosuch", "--yes")
    assert res.returncode == 2 and "no git remote named 'nosuch'" in res.stderr and "Traceback" not in res.stderr
    res = cli(work, "init", "--remote", "origin", "--lease-repo", str(bare), "--yes")
    assert res.returncode == 2
    assert git(work, "config", "--get-regexp", r"^lease\.", check=False) == ""


def test_init_unsigned_and_without_hooks_on_request(tmp_path, isolated_git):
    bare, work = _clone(tmp_path)
    leases = make_bare(tmp_path / "leases.git")
    res = cli(work, "init", "--lease-repo", leases.as_uri(), "--no-sign", "--no-hooks", "--yes", "--json")
    steps = {s["name"]: s for s in json.loads(res.stdout)["result"]["steps"]}
    assert steps["remote"]["status"] == "set" and "dedicated lease repository" in steps["remote"]["detail"]
    assert steps["key"]["status"] == "skipped" and steps["hooks"]["status"] == "skipped"
    assert not (isolated_git / ".ssh").exists()
    assert cli(work, "acquire", "--scope", "x").returncode == 0
    assert "refs/leases/id/" in git(leases, "for-each-ref", "refs/leases/")
