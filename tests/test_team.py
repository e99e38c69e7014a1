"""A team's first week: the defaults and refusals a new team meets (agent ids, reads without a store chosen)."""

import json
import os
import re
import subprocess

import pytest
from conftest import cli, git
from test_init import _clone

from gitlease.core.config import default_agent, resolve


def _clone_without_store(tmp_path):
    """A clone of a bare remote with one commit, where ``git lease init`` never ran (no lease.remote)."""
    return _clone(tmp_path)


# ------------------------------------------------------------------------------------ agent id default


def test_the_default_agent_id_is_the_users_name_at_the_host_never_a_uid(tmp_path):
    import pwd

    name = pwd.getpwuid(os.getuid()).pw_name
    host = os.uname().nodename
    # root in a container: no $USER, no $LOGNAME; the password database names uid 0
    assert default_agent({}) == f"{name}@{host}"
    assert resolve({}, env={}).agent == f"{name}@{host}"
    assert resolve({}, env={"USER": "ada"}).agent == f"ada@{host}"
    # a uid with no name (a container run as --user 4242): the host alone
    taken = {p.pw_uid for p in pwd.getpwall()}
    nameless = next(u for u in range(4242, 70000) if u not in taken)
    assert default_agent({}, uid=nameless, host="box-1") == "box-1"
    assert "uid" not in default_agent({}, uid=nameless, host="box-1")


def test_acquire_records_the_named_agent_when_the_environment_has_no_user(make_repo, monkeypatch):
    repo = make_repo("a")
    monkeypatch.delenv("USER", raising=False)
    monkeypatch.delenv("LOGNAME", raising=False)
    res = cli(repo, "acquire", "--scope", "README", "--json")
    assert res.returncode == 0, res.stderr
    status = json.loads(cli(repo, "status", "--json").stdout)["result"]
    agent = status["leases"][0]["owner"]["agentId"]
    assert not agent.startswith("uid") and agent.endswith("@" + os.uname().nodename), agent


# ------------------------------------------------------------------- reads refuse without a store chosen


@pytest.mark.parametrize(
    "args",
    [
        ["can-start", "--scope", "src"],
        ["status"],
        ["show", "lease_01m8vf6hkhda1tsp"],
        ["log"],
    ],
)
def test_reads_refuse_to_answer_from_the_clone_when_it_has_a_remote_and_no_store_is_set(tmp_path, args):
    bare, work = _clone_without_store(tmp_path)
    # another agent holds src on the shared store
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(bare), str(other))
    git(other, "config", "lease.remote", "origin")
    assert cli(other, "acquire", "--scope", "src").returncode == 0
    res = cli(work, *args, "--json")
    assert res.returncode == 2, (args, res.stdout, res.stderr)
    assert "lease.remote is not set and this repository has remotes" in res.stderr
    assert json.loads(res.stdout)["error"]["kind"] == "usage"
    assert "free" not in res.stdout
    # chosen on purpose: the answers come from where they were asked
    assert cli(work, "can-start", "--scope", "src", "--remote", "origin").returncode == 3
    assert cli(work, "can-start", "--scope", "src", "--remote", "local").returncode == 0


def test_plan_refuses_too_without_a_store_chosen(tmp_path):
    _bare, work = _clone_without_store(tmp_path)
    res = cli(work, "plan", "-", input='{"id": "t1", "paths": ["src"]}\n')
    assert res.returncode == 2 and "lease.remote is not set" in res.stderr, res.stderr


# ------------------------------------------------------------------------------- verify's default range


def test_verify_defaults_to_the_current_branch_against_its_upstream(tmp_path):
    bare, work = _clone_without_store(tmp_path)
    git(work, "config", "lease.remote", "origin")
    lease = json.loads(cli(work, "acquire", "--scope", "src", "--json").stdout)["result"]["leaseId"]
    # a task branch named after its lease, pushed (its upstream is its own copy on origin)
    git(work, "switch", "-q", "-c", f"task/{lease}")
    (work / "src").mkdir()
    (work / "src" / "a.py").write_text("print(1)\n")
    git(work, "add", "src")
    git(work, "commit", "-q", "-m", "a")
    git(work, "push", "-q", "-u", "origin", f"task/{lease}")
    res = cli(work, "verify")
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"verify ok: 1 path in 1 commit (origin/main..task/{lease}), lease {lease} (from branch)\n"
    # a branch that tracks main: checked against it, here against others' leases only
    git(work, "switch", "-q", "-c", "fix", "--track", "origin/main")
    (work / "docs.md").write_text("x\n")
    git(work, "add", "docs.md")
    git(work, "commit", "-q", "-m", "docs")
    res = cli(work, "verify")
    assert res.returncode == 0 and "(origin/main..fix), no lease named" in res.stdout, res.stdout + res.stderr
    # detached, no upstream: HEAD against the remote's default branch; --head and --base still win
    git(work, "switch", "-q", "--detach", f"task/{lease}")
    assert "(origin/main..HEAD)" in cli(work, "verify", "--lease", lease).stdout
    res = cli(work, "verify", "--head", "fix", "--base", f"task/{lease}")
    assert res.returncode == 0 and f"(task/{lease}..fix)" in res.stdout, res.stderr


def test_verify_and_the_server_hook_say_in_one_line_how_to_sign_an_unsigned_commit(tmp_path):
    bare, work = _clone_without_store(tmp_path)
    assert cli(bare, "install-hooks", "--server").returncode == 0
    res = cli(work, "init", "--remote", "origin", "--agent", "agent-1", "--signer", "box-1", "--yes")
    assert res.returncode == 0 and "signing: set:" in res.stdout, res.stdout
    git(work, "pull", "-q", "--ff-only")
    git(work, "config", "commit.gpgSign", "false")  # a clone whose commits are not signed
    lease = json.loads(cli(work, "acquire", "--scope", "src", "--json").stdout)["result"]["leaseId"]
    git(work, "switch", "-q", "-c", "fix")
    (work / "src").mkdir()
    (work / "src" / "a.py").write_text("print(1)\n")
    git(work, "add", "src")
    git(work, "commit", "-q", "-m", "a", "--trailer", f"Lease: {lease}")
    unsigned = git(work, "rev-parse", "HEAD").strip()
    hint = (
        f"commit {unsigned[:12]} is not SSH-signed, so a Lease: claim in it does not count on this signed store: "
        "run git lease init in the clone that made it (it sets gpg.format=ssh, user.signingKey, commit.gpgSign), "
        "sign again with git rebase --force-rebase --gpg-sign"
    )
    # the server hook refuses the push, and says how to sign it
    res = subprocess.run(["git", "push", "-q", "origin", "fix"], cwd=work, capture_output=True, text=True)
    assert res.returncode != 0 and f"remote: gitlease: {hint} BASE (where the branch starts)" in res.stderr, res.stderr
    # so does the CI check, for the same commit on a branch that reached the remote another way
    ci = tmp_path / "ci"
    git(tmp_path, "clone", "-q", str(bare), str(ci))
    git(ci, "fetch", "-q", str(work), f"{unsigned}:refs/heads/fix")
    git(ci, "switch", "-q", "fix")
    res = cli(ci, "verify", "--remote", "origin")
    assert res.returncode == 4, res.stdout + res.stderr
    assert f"gitlease: {hint} origin/main, and push again" in res.stderr.splitlines()
    # doing what it says works: init signs again, the rebase signs the commit, the push and the check pass
    assert "signing: set:" in cli(work, "init", "--remote", "origin", "--agent", "agent-1", "--yes").stdout
    git(work, "rebase", "-q", "--force-rebase", "--gpg-sign", "origin/main")
    git(work, "push", "-q", "origin", "fix")
    git(ci, "fetch", "-q", "origin")
    git(ci, "reset", "-q", "--hard", "origin/fix")
    res = cli(ci, "verify", "--remote", "origin")
    assert res.returncode == 0 and f"lease {lease} (from trailer)" in res.stdout, res.stdout + res.stderr


# ------------------------------------------------------------------------------------------ CI templates

PIN = "git+https://example.invalid/acme/gitlease@0123456789abcdef0123456789abcdef01234567"


def test_the_verify_check_installs_a_pinned_gitlease_and_validates(make_repo):
    from test_sweep import _check_schema, _yaml

    repo = make_repo("gh")
    res = cli(repo, "ci", "install", "github", "--job", "verify", "--job", "sweep", "--install", PIN)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[:2] == [
        "wrote: .github/workflows/gitlease-verify.yml",
        "wrote: .github/workflows/gitlease-sweep.yml",
    ]
    assert "required status check" in res.stdout
    wf = repo / ".github/workflows/gitlease-verify.yml"
    _check_schema("vendor.github-workflows", wf)
    doc = _yaml(wf)
    assert doc["permissions"] == {"contents": "read"}
    runs = [s.get("run", "") for s in doc["jobs"]["verify"]["steps"]]
    assert f'python -m pip install --quiet "{PIN}"' in runs
    assert 'git lease verify --remote origin --base "origin/${{ github.base_ref }}" --head HEAD' in runs
    assert "pip install gitlease" not in wf.read_text()
    gl = make_repo("gl")
    res = cli(gl, "ci", "install", "gitlab", "--job", "sweep", "--job", "verify", "--install", PIN)
    assert res.returncode == 0, res.stderr
    _check_schema("vendor.gitlab-ci", gl / ".gitlab/gitlease-verify.yml")
    assert _yaml(gl / ".gitlab-ci.yml") == {
        "include": [{"local": ".gitlab/gitlease-sweep.yml"}, {"local": ".gitlab/gitlease-verify.yml"}]
    }
    spec = _yaml(gl / ".gitlab/gitlease-verify.yml")["gitlease-verify"]
    assert f'python -m pip install --quiet "{PIN}"' in spec["before_script"]
    assert "merge_request_event" in spec["rules"][0]["if"]


def test_the_verify_check_without_install_is_this_gitlease_pinned_or_a_question(make_repo):
    repo = make_repo("project")
    res = cli(repo, "ci", "install", "github", "--job", "verify", "--json")
    if res.returncode == 0:  # this gitlease came from a clonable commit: pinned to it
        text = (repo / ".github/workflows/gitlease-verify.yml").read_text()
        assert re.search(r'pip install --quiet "git\+\S+@[0-9a-f]{40}"', text), text
    else:
        assert res.returncode == 2 and "--install SPEC" in res.stderr
    assert "pip install gitlease\n" not in res.stdout
