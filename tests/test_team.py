"""A team's first week: the defaults and refusals a new team meets (agent ids, reads without a store chosen)."""

import json
import os

import pytest
from conftest import cli, git
from servers import make_bare

from gitlease.core.config import default_agent, resolve


def _clone_without_store(tmp_path):
    """A clone of a bare remote with one commit, where ``git lease init`` never ran (no lease.remote)."""
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
