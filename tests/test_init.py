"""``git lease init``: idempotent, and ``--yes`` in a fresh clone leaves a working, signed, enforced set-up."""

import json
import subprocess

from conftest import cli, git
from servers import make_bare

from gitlease.ops.trust import host_name


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
        "signing": "set",
        "trust": "set",
        "hooks": "set",
        "ci": "skipped",
    }
    assert (isolated_git / ".ssh" / "gitlease_agent-7").exists()
    config = git(work, "config", "--get-regexp", r"^lease\.")
    assert "lease.remote origin" in config and "lease.agent agent-7" in config and "lease.signingkey" in config
    key = str(isolated_git / ".ssh" / "gitlease_agent-7")
    assert git(work, "config", "--local", "--get-regexp", r"^(gpg\.format|user\.signingkey|commit\.gpgsign)$").split(
        "\n"
    )[:3] == ["gpg.format ssh", f"user.signingkey {key}", "commit.gpgsign true"]
    # the key is trusted on the store's default branch, in this host's own signer file (a commit of its own)
    signer = f".gitlease/signers/{host_name()}.pub"
    trust = git(bare, "show", f"main:{signer}")
    assert trust.startswith('agent-7 namespaces="gitlease" ssh-ed25519 ') and trust.count("\n") == 1
    assert not (work / ".gitlease").exists()  # nothing left in the work tree to commit
    hooks = sorted(p.name for p in (work / ".git" / "hooks").iterdir() if not p.name.endswith(".sample"))
    second = cli(work, "init", "--remote", "origin", "--agent", "agent-7", "--yes", "--json")
    doc2 = json.loads(second.stdout)["result"]
    assert second.returncode == 0 and not doc2["changed"]
    assert {s["status"] for s in doc2["steps"]} <= {"unchanged", "skipped"}
    assert git(bare, "show", f"main:{signer}") == trust
    assert len(git(bare, "rev-list", "main").split()) == 2  # the seed and the trust commit: nothing more
    assert sorted(p.name for p in (work / ".git" / "hooks").iterdir() if not p.name.endswith(".sample")) == hooks
    assert "nothing to change" in cli(work, "init").stdout


def test_init_yes_in_a_fresh_clone_leaves_a_working_setup(tmp_path):
    bare, work = _clone(tmp_path)
    res = cli(work, "init", "--remote", "origin", "--agent", "agent-7", "--yes")
    assert res.returncode == 0 and "trust: set: added .gitlease/signers/" in res.stdout, res.stdout
    git(work, "pull", "-q", "--ff-only")  # the trust commit init pushed
    res = cli(work, "acquire", "--scope", "src", "--json")
    assert res.returncode == 0, res.stderr
    lease = json.loads(res.stdout)["result"]["leaseId"]
    status = cli(work, "status")
    assert status.stdout.startswith("signed: trust from .gitlease/signers/ (1 file) on main") and lease in status.stdout
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


def test_init_in_a_linked_worktree_with_worktree_config_signs_there_only(tmp_path, isolated_git):
    bare, work = _clone(tmp_path)
    git(work, "config", "extensions.worktreeConfig", "true")
    linked = tmp_path / "linked"
    git(work, "worktree", "add", "-q", "-b", "side", str(linked))
    res = cli(linked, "init", "--remote", "origin", "--agent", "agent-8", "--signer", "box-8", "--yes", "--json")
    assert res.returncode == 0, res.stderr
    steps = {s["name"]: s for s in json.loads(res.stdout)["result"]["steps"]}
    assert steps["signing"]["status"] == "set" and "this worktree's config" in steps["signing"]["detail"]
    assert git(linked, "config", "--worktree", "commit.gpgSign").strip() == "true"
    assert git(work, "config", "--local", "commit.gpgSign", check=False) == ""  # the main worktree: unchanged
    # a commit made there is signed with the lease key
    (linked / "f.txt").write_text("x\n")
    git(linked, "add", "f.txt")
    git(linked, "commit", "-q", "-m", "signed")
    assert "-----BEGIN SSH SIGNATURE-----" in git(linked, "cat-file", "commit", "HEAD")
    assert git(bare, "show", "main:.gitlease/signers/box-8.pub").startswith("agent-8 ")


def test_init_says_what_to_do_when_the_branch_refuses_the_trust_commit(tmp_path, isolated_git):
    bare, work = _clone(tmp_path)
    hook = bare / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'main is protected' >&2\nexit 1\n")
    hook.chmod(0o755)
    res = cli(work, "init", "--remote", "origin", "--agent", "agent-9", "--signer", "box-9", "--yes")
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("trust: "))
    assert line.startswith("trust: todo: ") and "main is protected" in line
    assert "git lease trust add box-9 --agents agent-9" in line
    # without a yes nothing is published and the command to run is named
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(bare), str(other))
    hook.unlink()
    res = cli(
        other,
        "init",
        "--remote",
        "origin",
        "--agent",
        "agent-9",
        "--key",
        str(isolated_git / ".ssh" / "gitlease_agent-9"),
    )
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("trust: "))
    assert (
        line
        == "trust: todo: git lease trust add "
        + host_name()
        + " --agents agent-9 (publishes .gitlease/signers/"
        + host_name()
        + ".pub), or --no-push for review"
    )
    assert git(bare, "ls-tree", "main", ".gitlease/") == ""


def test_init_on_one_machine_writes_the_signer_file_to_commit(make_repo, isolated_git):
    repo = make_repo("solo")
    res = cli(repo, "init", "--sign", "--signer", "solo", "--yes")
    assert res.returncode == 0, res.stderr
    assert "trust: set: wrote .gitlease/signers/solo.pub; commit it to the default branch" in res.stdout
    assert "write solo's signer file, to commit to this repository's default branch?" in res.stdout
    line = (repo / ".gitlease" / "signers" / "solo.pub").read_text()
    assert line.startswith(f'{git(repo, "config", "lease.agent").strip()} namespaces="gitlease" ssh-ed25519 ')
    git(repo, "add", ".gitlease")
    git(repo, "commit", "-q", "-m", "trust solo")  # signed by init's set-up
    assert "-----BEGIN SSH SIGNATURE-----" in git(repo, "cat-file", "commit", "HEAD")
    status = cli(repo, "status")
    assert status.stdout.startswith("signed: trust from .gitlease/signers/ (1 file) on "), status.stdout
