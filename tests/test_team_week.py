"""A team's first week, end to end: three signed hosts and a lead join one repository behind ``git daemon`` with
the server hook installed, at the same time; each host runs the README's flow (a lease, a signed commit naming
it, a fenced push, a refused overlap, status); each change passes the CI check as the verify template runs it
and lands on main through the server hook; a fourth host joins and one is revoked. Nothing conflicts, and every
check passes for the reason it should: the negative controls (an unsigned commit, a revoked key) are refused."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import cli, git
from servers import new_remote

PIN = "git+https://example.invalid/acme/gitlease@0123456789abcdef0123456789abcdef01234567"


class Host:
    """One machine of the team: its own HOME (so its own key), clones of the one remote, agents <s>-1 and <s>-2."""

    def __init__(self, root: Path, url: str, name: str, agents: str | None = None) -> None:
        self.name, self.url = name, url
        self.stem = name.split("-")[-1]
        self.dir = root / name
        self.home = self.dir / "home"
        self.home.mkdir(parents=True)
        self.agents = agents or f"{self.stem}-1..2"

    def lease(self, where: Path, *args: str) -> subprocess.CompletedProcess:
        return cli(where, *args, env={"HOME": str(self.home)}, timeout=120)

    def clone(self, name: str, agent: str | None = None) -> Path:
        path = self.dir / name
        git(self.dir, "clone", "-q", self.url, str(path))
        res = self.lease(path, "init", "--remote", "origin", "--agents", self.agents, "--signer", self.name, "--yes")
        assert res.returncode == 0, res.stdout + res.stderr
        if agent:
            git(path, "config", "lease.agent", agent)
        return path


def _lease_id(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)["result"]["leaseId"]


def _readme_flow(host: Host, out: dict) -> None:
    """The README's three-agent block on one host: <s>-1 leases, commits signed with a Lease: trailer and lands
    its branch with a fenced push; <s>-2 is refused the same scope (exit 3, naming <s>-1) and takes another."""
    s = host.stem
    one, two = host.clone("agent-1", f"{s}-1"), host.clone("agent-2", f"{s}-2")
    lease = _lease_id(host.lease(one, "acquire", "--scope", f"services/{s}", "--ttl", "10m", "--json"))
    git(one, "switch", "-q", "-c", f"{s}-work")
    (one / "services" / s).mkdir(parents=True)
    (one / "services" / s / "invoice.py").write_text("total = 42\n")
    git(one, "add", "services")
    git(one, "commit", "-q", "-m", f"{s}: invoice total", "--trailer", f"Lease: {lease}")
    pushed = host.lease(one, "push", "origin", f"{s}-work")
    refused = host.lease(two, "acquire", "--scope", f"services/{s}")
    kept = _lease_id(host.lease(two, "acquire", "--scope", f"libs/{s}", "--json"))
    status = host.lease(two, "status", "--json")
    out.update(
        one=one, two=two, lease=lease, kept=kept, pushed=pushed, refused=refused, status=status,
        head=git(one, "rev-parse", "HEAD").strip(),
    )  # fmt: skip


def _in_parallel(jobs) -> None:
    """Run each job in a thread of its own, all released together; re-raise the first failure."""
    start = threading.Barrier(len(jobs))
    errors: list[BaseException] = []

    def run(job):
        start.wait()
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _verify_command() -> str:
    """The verify step of the GitHub template as ``ci install github --job verify`` writes it, for a pull
    request into main (``${{ github.base_ref }}`` is what GitHub puts there)."""
    from ruamel.yaml import YAML

    from gitlease.ops.templates import render

    doc = YAML(typ="safe").load(render("github", PIN, job="verify"))
    steps = doc["jobs"]["verify"]["steps"]
    assert any(s.get("run") == f'python -m pip install --quiet "{PIN}"' for s in steps)  # a pin that exists
    (run,) = [s["run"] for s in steps if "git lease verify" in s.get("run", "")]
    return run.replace("${{ github.base_ref }}", "main")


def _ci_check(root: Path, url: str, branch: str, sha: str, name: str) -> subprocess.CompletedProcess:
    """The CI job: a fresh checkout of the pull request's head (detached, as actions/checkout leaves it), then
    the template's verify command, with GITHUB_HEAD_REF set as GitHub does."""
    ci = root / f"ci-{name}"
    git(root, "clone", "-q", url, str(ci))
    git(ci, "checkout", "-q", "--detach", sha)
    argv = shlex.split(_verify_command())
    assert argv[:3] == ["git", "lease", "verify"]
    return cli(ci, *argv[2:], env={"GITHUB_HEAD_REF": branch})


def _land(merger: Path, branch: str) -> subprocess.CompletedProcess:
    """The merge button: main gains the branch through a merge commit, judged by the server hook."""
    git(merger, "fetch", "-q", "origin")
    git(merger, "reset", "-q", "--hard", "origin/main")
    git(merger, "merge", "-q", "--no-ff", "-m", f"merge {branch}", f"origin/{branch}")
    return subprocess.run(["git", "push", "origin", "HEAD:main"], cwd=merger, capture_output=True, text=True)


@pytest.fixture
def team(tmp_path, git_daemon):
    remote = new_remote("daemon", git_daemon, f"team-{tmp_path.name}.git")
    seed = tmp_path / "seed"
    git(tmp_path, "init", "-q", str(seed))
    (seed / "README").write_text("x\n")
    git(seed, "add", "README")
    git(seed, "commit", "-q", "-m", "start")
    git(seed, "push", "-q", remote.url, "HEAD:refs/heads/main")
    assert cli(remote.path, "install-hooks", "--server").returncode == 0
    return remote


def test_a_signed_team_of_three_hosts_joins_works_lands_grows_and_revokes(tmp_path, team):
    url = team.url
    hosts = [Host(tmp_path, url, f"host-{s}") for s in "abc"]
    lead = Host(tmp_path, url, "lead", agents="lead")
    # ------------------------------------------------------------------ monday: everyone joins at once
    setups: dict[str, Path] = {}
    _in_parallel([lambda h=h: setups.__setitem__(h.name, h.clone("setup")) for h in [*hosts, lead]])
    res = lead.lease(setups["lead"], "trust", "add", "lead", "--agents", "lead", "--admin")
    assert res.returncode == 0 and "signer lead: updated on main of origin" in res.stdout, res.stdout + res.stderr
    files = git(team.path, "ls-tree", "--name-only", "main", ".gitlease/signers/").split()
    assert files == [f".gitlease/signers/{n}.pub" for n in ("host-a", "host-b", "host-c", "lead")]
    assert git(team.path, "rev-list", "--merges", "main") == ""  # nothing to merge: one file per signer
    # ------------------------------------------------------------- the README's flow on every host at once
    flows: dict[str, dict] = {h.name: {} for h in hosts}
    _in_parallel([lambda h=h: _readme_flow(h, flows[h.name]) for h in hosts])
    for h in hosts:
        got = flows[h.name]
        assert got["pushed"].returncode == 0, got["pushed"].stderr
        assert got["refused"].returncode == 3 and f"agent={h.stem}-1" in got["refused"].stderr
        status = json.loads(got["status"].stdout)["result"]
        assert status["signed"] and status["trust"].startswith("signed: trust from .gitlease/signers/ (4 files)")
        assert {v["verification"] for v in status["leases"]} == {"verified"} and len(status["leases"]) >= 2
    _ci_and_land(tmp_path, team, hosts, flows)
    _grow_and_revoke(tmp_path, team, hosts, lead, setups, flows)


def _ci_and_land(tmp_path: Path, team, hosts: list[Host], flows: dict[str, dict]) -> None:
    """Each branch passes the CI check because its commit names its lease and is signed by that lease's key,
    then lands on main through the server hook; the same commit unsigned is refused by both, saying why."""
    for h in hosts:
        got = flows[h.name]
        ci = _ci_check(tmp_path, team.url, f"{h.stem}-work", got["head"], h.name)
        want = f"verify ok: 1 path in 1 commit (origin/main..HEAD), lease {got['lease']} (from trailer)"
        assert ci.returncode == 0 and ci.stdout.strip() == want, ci.stdout + ci.stderr
    # the negative control: host-a's commit made again without a signature, same trailer
    a = flows["host-a"]
    git(a["one"], "switch", "-q", "-c", "a-unsigned", a["head"])
    git(a["one"], "-c", "commit.gpgSign=false", "commit", "-q", "--amend", "--no-edit")
    unsigned = git(a["one"], "rev-parse", "HEAD").strip()
    res = subprocess.run(["git", "push", "origin", "a-unsigned"], cwd=a["one"], capture_output=True, text=True)
    assert res.returncode != 0 and f"commit {unsigned[:12]} is not SSH-signed" in res.stderr, res.stderr
    ci = tmp_path / "ci-unsigned"
    git(tmp_path, "clone", "-q", team.url, str(ci))
    git(ci, "fetch", "-q", str(a["one"]), "a-unsigned")
    git(ci, "checkout", "-q", "--detach", unsigned)
    argv = shlex.split(_verify_command())
    res = cli(ci, *argv[2:])
    assert res.returncode == 4 and f"commit {unsigned[:12]} is not SSH-signed" in res.stderr, res.stderr
    # landing: main gains each branch through the server hook while its lease is live, then the lease goes
    merger = tmp_path / "merger"
    git(tmp_path, "clone", "-q", team.url, str(merger))
    for h in hosts:
        res = _land(merger, f"{h.stem}-work")
        assert res.returncode == 0, res.stderr
        assert h.lease(flows[h.name]["one"], "release", flows[h.name]["lease"]).returncode == 0
    landed = git(team.path, "ls-tree", "-r", "--name-only", "main", "services/").split()
    assert landed == [f"services/{s}/invoice.py" for s in "abc"]


def _grow_and_revoke(tmp_path, team, hosts, lead, setups, flows) -> None:
    """A fourth host joins and works; host-b is revoked: its key writes nothing more, its live lease stops
    verifying and keeps its scope blocked until the lead (an admin key) clears it."""
    d = Host(tmp_path, team.url, "host-d")
    work = d.clone("agent-1", "d-1")
    mine = _lease_id(d.lease(work, "acquire", "--scope", "services/d", "--json"))
    a_two = flows["host-a"]["two"]
    status = json.loads(hosts[0].lease(a_two, "status", "--json").stdout)["result"]
    assert {v["leaseId"]: v["verification"] for v in status["leases"]}[mine] == "verified"
    # revoking host-b: its file goes, in a commit of its own
    res = hosts[0].lease(setups["host-a"], "trust", "remove", "host-b")
    assert res.returncode == 0 and "signer host-b: removed from main of origin" in res.stdout, res.stderr
    b = flows["host-b"]
    res = hosts[1].lease(b["two"], "acquire", "--scope", "libs/b2")  # host-b still trusts its own cached trust
    assert res.returncode != 0 and "is not trusted for agent 'b-2'" in res.stderr, res.stderr  # the server hook
    assert "libs/b2" not in git(team.path, "for-each-ref", "--format=%(refname)", "refs/leases/")
    status = json.loads(hosts[0].lease(a_two, "status", "--json").stdout)["result"]
    view = {v["leaseId"]: v for v in status["leases"]}[b["kept"]]
    assert not view["valid"] and any("not trusted" in p for p in view["problems"])
    blocked = hosts[0].lease(a_two, "acquire", "--scope", "libs/b")
    assert blocked.returncode == 3  # an invalid lease still blocks its scope (fail closed)
    cleared = lead.lease(setups["lead"], "release", "--force", b["kept"])
    assert cleared.returncode == 0 and f"lease released: {b['kept']}" in cleared.stdout, cleared.stderr
    assert hosts[0].lease(a_two, "acquire", "--scope", "libs/b").returncode == 0
    # the trust history: one commit per change, never a merge, and what each file says is what its host wrote
    log = git(team.path, "log", "--format=%s", "main", "--", ".gitlease/").splitlines()
    assert re.fullmatch(r"gitlease: revoke host-b \(\.gitlease/signers/host-b\.pub\)", log[0])
    assert sorted(re.sub(r"gitlease: (\w+) (\S+) .*", r"\1 \2", line) for line in log) == [
        "revoke host-b",
        "trust host-a",
        "trust host-b",
        "trust host-c",
        "trust host-d",
        "trust lead",
        "trust lead",  # its line again, now with gitlease-admin
    ]
    assert git(team.path, "rev-list", "--merges", "main", "--", ".gitlease/") == ""
    files = git(team.path, "ls-tree", "--name-only", "main", ".gitlease/signers/").split()
    assert files == [f".gitlease/signers/{n}.pub" for n in ("host-a", "host-c", "host-d", "lead")]
