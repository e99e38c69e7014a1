"""Issue 21: the rough edges a new user hit in the first hour, each through the real ``git lease`` executable
(or the Python API where the edge was there): usage errors, lease ids, release cases, status, warnings, a
store git never reached, a lease nobody would trust."""

import json
import re

import pytest
from conftest import cli, git
from test_identity import Signed

import gitlease
from gitlease.core import errors


def _remote_repo(make_repo, tmp_path, name="a"):
    bare = tmp_path / "remote.git"
    if not bare.exists():
        git(tmp_path, "init", "-q", "--bare", str(bare))
    repo = make_repo(name)
    git(repo, "config", "lease.remote", bare.as_uri())
    return repo, bare


def _lease(res):
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["result"]["leaseId"]


# ---------------------------------------------------------------------------------------------- item 1


@pytest.mark.parametrize(
    "args,needle",
    [
        (["acquire", "-s", "x", "--ttl", "5x"], "--ttl must be a duration (300, 300s, 5m, 2h, 1d), not '5x'"),
        (["acquire", "-s", "x", "--ttl", "-5"], "--ttl must be between 5 and"),
        (["acquire", "-s", "x", "--wait", "abc"], "--wait must be a duration"),
        (["renew", "lease_01m8vf6hkhda1tsp", "--ttl", "soon"], "--ttl must be a duration"),
        (["run", "-s", "x", "--renew-every", "often", "--", "true"], "--renew-every must be a duration"),
        (["log", "--since", "yesterday"], "--since takes a duration"),
    ],
)
def test_every_bad_option_value_is_a_usage_error_exit_2(make_repo, args, needle):
    repo = make_repo("a")
    res = cli(repo, args[0], "--json", *args[1:])
    assert res.returncode == 2, (args, res.stderr)
    assert needle in res.stderr and "whole number of seconds" not in res.stderr
    doc = json.loads(res.stdout.splitlines()[-1])
    assert doc["error"]["kind"] == "usage" and doc["error"]["exitCode"] == 2


def test_log_since_takes_a_date_alone(make_repo):
    repo = make_repo("a")
    _lease(cli(repo, "acquire", "-s", "README", "--json"))
    res = cli(repo, "log", "--since", "2000-12-01")
    assert res.returncode == 0, res.stderr
    assert "acquire" in res.stdout
    res = cli(repo, "log", "--since", "2999-12-01", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["result"]["events"] == []


# ---------------------------------------------------------------------------------------------- item 2


@pytest.mark.parametrize(
    "command",
    [["release"], ["renew"], ["show"], ["worktree", "add"], ["sweep-stale", "--force"], ["log", "--lease"]],
)
def test_a_malformed_lease_id_is_refused_before_any_file_is_named_after_it(make_repo, command):
    repo = make_repo("a")
    before = sorted(p for p in (repo / ".git").rglob("*"))
    bads = ("../zz", "lease_../../x", "LEASE_X", "lease_01m8vf6hkhda1tsp\n") if command == ["release"] else ("../zz",)
    for bad in bads:
        res = cli(repo, *command, bad, "--json")
        assert res.returncode == 2, (bad, res.stderr)
        assert "not a lease id" in res.stderr and "internal error" not in res.stderr
        assert json.loads(res.stdout)["error"]["kind"] == "usage"
    assert sorted(p for p in (repo / ".git").rglob("*")) == before


def test_no_lock_file_for_a_lease_this_worktree_does_not_hold(make_repo):
    repo = make_repo("a")
    for cmd in ("renew", "release"):
        cli(repo, cmd, "lease_01m8vf6hkhda1tsp")
    state = repo / ".git" / "gitlease"
    assert not state.exists() or not [p.name for p in state.iterdir() if p.name.startswith("renew-")]


# ---------------------------------------------------------------------------------------------- item 3


def test_release_twice_is_idempotent_a_typo_is_named_and_another_worktree_is_shown(make_repo, tmp_path):
    repo, _ = _remote_repo(make_repo, tmp_path)
    lease = _lease(cli(repo, "acquire", "-s", "README", "--json"))
    res = cli(repo, "release", lease)
    assert res.returncode == 0 and res.stdout == f"lease released: {lease}\n"
    res = cli(repo, "release", lease)  # again: already released, not an error
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"already released: {lease} (released by ")
    doc = json.loads(cli(repo, "release", lease, "--json").stdout)
    assert doc["ok"] and doc["result"]["already"] is True

    res = cli(repo, "release", "lease_01m8vf6hkhda1tzz", "--json")  # never there
    assert res.returncode == 1 and "typo" in res.stderr and "never held it" in res.stderr
    assert json.loads(res.stdout)["error"]["kind"] == "not-held"

    other = tmp_path / "other"
    git(repo, "worktree", "add", "-q", "--detach", str(other))
    held = _lease(cli(other, "acquire", "-s", "README", "--json"))
    res = cli(repo, "release", held)
    assert res.returncode == 1
    assert f"git -C {other} lease release {held}" in res.stderr, res.stderr
    assert cli(other, "release", held).returncode == 0


def test_release_of_a_lease_held_on_another_host_says_by_whom(make_repo, tmp_path):
    a, _ = _remote_repo(make_repo, tmp_path, "a")
    b, _ = _remote_repo(make_repo, tmp_path, "b")
    lease = _lease(cli(a, "acquire", "-s", "README", "--agent", "worker-7", "--task", "job-9", "--json"))
    res = cli(b, "release", lease)
    assert res.returncode == 1
    assert "held by agent worker-7 (task job-9)" in res.stderr and "release --force" in res.stderr


# ---------------------------------------------------------------------------------------------- item 4


def test_status_marks_own_leases_quotes_scopes_and_says_ago(make_repo, tmp_path):
    repo, _ = _remote_repo(make_repo, tmp_path)
    other = make_repo("b")
    git(other, "config", "lease.remote", (tmp_path / "remote.git").as_uri())
    mine = _lease(cli(repo, "acquire", "-s", "my dir/x", "--json"))
    theirs = _lease(cli(other, "acquire", "-s", "README", "--ttl", "5", "--json"))
    res = cli(repo, "status")
    lines = {ln.split()[0]: ln for ln in res.stdout.splitlines() if ln.startswith("lease_")}
    assert "'my dir/x'" in lines[mine] and lines[mine].endswith("[held here]")
    assert "[held here]" not in lines[theirs]
    res = cli(repo, "status", "--mine", "--json")
    assert [x["leaseId"] for x in json.loads(res.stdout)["result"]["leases"]] == [mine]


def test_an_expired_lease_says_how_long_ago(tmp_path):
    """The status line of a lease past its expiry: "expired 105s ago", never "-105s left" (fake clock)."""
    from gitlease.cli.core import _snapshot_lines
    from testing.fleet import Fleet

    fleet = Fleet(tmp_path, None)
    a = fleet.agent("a")
    got = a.acquire(["svc"], ttl=60)
    fleet.clock.advance(165)
    lines = _snapshot_lines(a.status(), fleet.clock.now(), a.settings.skew, set(a.held_here()))
    line = next(ln for ln in lines if ln.startswith(got.lease_id))
    assert "expired 105s ago" in line and "left" not in line and line.endswith("[held here]")
    fleet.clock.advance(-90)  # within the skew margin: still blocks
    lines = _snapshot_lines(a.status(), fleet.clock.now(), a.settings.skew)
    assert "grace: expired 15s ago" in next(ln for ln in lines if ln.startswith(got.lease_id))


def test_release_all_gives_back_this_worktrees_leases_only(make_repo, tmp_path):
    repo, _ = _remote_repo(make_repo, tmp_path)
    other = make_repo("b")
    git(other, "config", "lease.remote", (tmp_path / "remote.git").as_uri())
    one = _lease(cli(repo, "acquire", "-s", "a", "--json"))
    two = _lease(cli(repo, "acquire", "-s", "b", "--json"))
    keep = _lease(cli(other, "acquire", "-s", "c", "--json"))
    res = cli(repo, "release", "--all")
    assert res.returncode == 0 and sorted(res.stdout.splitlines()) == sorted(
        [f"lease released: {one}", f"lease released: {two}"]
    )
    assert cli(repo, "release", "--all").stdout == "no leases held by this worktree\n"
    assert keep in cli(repo, "status").stdout
    assert cli(repo, "release", one, "--all").returncode == 2


# ---------------------------------------------------------------------------------------------- items 6-8


def test_a_typo_in_the_remote_cannot_reach_the_store_not_an_unknown_outcome(make_repo):
    repo = make_repo("a")
    res = cli(repo, "acquire", "-s", "README", "--remote", "origni", "--json")
    assert res.returncode == 1
    assert "cannot reach the lease store 'origni'" in res.stderr and "unknown" not in res.stderr
    assert json.loads(res.stdout)["error"]["kind"] == "remote-unavailable"


def test_a_scope_that_matches_nothing_is_granted_with_a_warning(make_repo):
    repo = make_repo("a")
    (repo / "services" / "billing").mkdir(parents=True)
    (repo / "services" / "billing" / "x.py").write_text("x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "x")
    res = cli(repo, "acquire", "-s", "servics/billing", "--json")
    assert res.returncode == 0
    assert "warning: scope servics/billing matches no path" in res.stderr
    assert json.loads(res.stdout)["result"]["warnings"][0].startswith("scope servics/billing")
    res = cli(repo, "acquire", "-s", "services/billing", "-s", "services/new-dir-to-be")
    assert res.returncode == 0 and "services/billing " not in res.stderr and "new-dir-to-be" in res.stderr


def test_usage_lines_say_git_lease_not_git_dash_lease(make_repo):
    repo = make_repo("a")
    res = cli(repo, "acquire", "--bogus")
    assert res.returncode == 2 and "Usage: git lease acquire" in res.stderr and "git-lease acquire" not in res.stderr
    assert "Usage: git lease renew" in cli(repo, "renew", "-h").stdout


# ---------------------------------------------------------------------------------------------- items 9, 11


def test_hold_takes_a_scope_string_and_release_answers_true(make_repo):
    repo = make_repo("a")
    for through_agent in (False, True):
        with gitlease.hold(str(repo), scope="services/tax", ttl=60, renew_agent=through_agent) as lease:
            assert lease.paths == ("services/tax",)
    svc = gitlease.open_service(str(repo))
    got = svc.acquire("libs/tax")
    assert got.record.paths == ("libs/tax",)
    released = svc.release(got.lease_id)
    assert released and not released.already and released.audit


def test_status_fresh_fails_when_the_store_is_unreachable(make_repo, tmp_path):
    repo, bare = _remote_repo(make_repo, tmp_path)
    assert cli(repo, "status").returncode == 0  # the state is cached
    bare.rename(tmp_path / "gone.git")
    res = cli(repo, "status", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["result"]["stale"] is True
    res = cli(repo, "status", "--fresh", "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["error"]["kind"] == "remote-unavailable"


# ---------------------------------------------------------------------------------------------- item 12


def test_the_log_answers_who_held_a_path_after_its_holder_released_it(make_repo, tmp_path):
    repo, _ = _remote_repo(make_repo, tmp_path)
    git(repo, "config", "lease.agent", "worker-2")
    lease = _lease(cli(repo, "acquire", "-s", "services/billing", "--json"))
    assert cli(repo, "release", lease).returncode == 0
    res = cli(repo, "log", "--lease", lease, "--json")
    events = json.loads(res.stdout)["result"]["events"]
    assert [(e["event"], e["by"]) for e in events] == [("acquire", "worker-2"), ("release", "worker-2")]


# ---------------------------------------------------------------------------------------------- trust


@pytest.fixture
def signed_cli(tmp_path, remote_file):
    """A signed store (trust file for a, b, c and admin boss) and a clone configured as agent a's."""
    fleet = Signed(tmp_path, remote_file.url)
    w = fleet.path("a")
    git(w, "config", "lease.remote", remote_file.url)
    git(w, "config", "lease.signingKey", fleet.keys["a"].path)
    git(w, "config", "lease.agent", "a")
    return fleet, w


def test_a_lease_nobody_would_trust_is_refused_exit_5_before_anything_is_written(signed_cli):
    fleet, w = signed_cli
    assert cli(w, "status").returncode == 0  # the trust file is read (and cached) once
    res = cli(w, "acquire", "-s", "svc", "--agent", "worker-4", "--json")
    assert res.returncode == 5, res.stderr
    doc = json.loads(res.stdout)
    assert doc["error"]["kind"] == "untrusted-writer" and doc["error"]["exitCode"] == 5
    assert "is not trusted for agent 'worker-4'" in res.stderr and "it is trusted as a" in res.stderr
    assert "nothing was written" in res.stderr
    assert cli(w, "status", "--json").stdout.count("leaseId") == 0
    # the Python API says the same
    svc = gitlease.open_service(str(w), agent="worker-4")
    with pytest.raises(gitlease.UntrustedWriter) as err:
        svc.acquire(["svc"])
    assert err.value.exit_code == 5 and isinstance(err.value, gitlease.InvalidRecord)
    # unsigned on a signed store: refused too
    git(w, "config", "--unset", "lease.signingKey")
    res = cli(w, "acquire", "-s", "svc")
    assert res.returncode == 5 and "lease.signingKey is not set" in res.stderr
    git(w, "config", "lease.signingKey", fleet.keys["a"].path)
    assert cli(w, "acquire", "-s", "svc").returncode == 0  # as a, trusted: fine


def test_a_key_added_to_the_trust_file_since_it_was_cached_is_seen(signed_cli):
    fleet, w = signed_cli
    assert cli(w, "status").returncode == 0  # trust cached without worker-4
    key = fleet.keys["eve"]
    text = (fleet.main / ".gitlease" / "allowed_signers").read_text()
    fleet.publish_trust(text + f'worker-4 namespaces="gitlease" {key.public_key()}\n')
    git(w, "config", "lease.signingKey", key.path)
    res = cli(w, "acquire", "-s", "svc", "--agent", "worker-4")
    assert res.returncode == 0, res.stderr


def test_an_unsigned_sweeper_on_a_signed_store_is_refused(tmp_path, remote_file):
    from gitlease.ops.sweep import Sweeper

    fleet = Signed(tmp_path, remote_file.url)
    got = fleet.agent("a").acquire(["svc"], ttl=60)
    fleet.clock.advance(200)
    sweeper = fleet.agent("gitlease-sweeper-github", key=None)
    with pytest.raises(errors.UntrustedWriter) as err:
        Sweeper(sweeper).sweep()
    assert "lease.signingKey is not set" in str(err.value)
    assert [v.lease_id for v in sweeper.status().leases] == [got.lease_id]  # no INVALID reclaim written
    assert Sweeper(sweeper).sweep(dry_run=True).results[0].outcome == "would-reclaim"


# ---------------------------------------------------------------------------------------------- CI job


def test_the_ci_install_line_is_this_gitlease_pinned_or_a_question(make_repo, tmp_path):
    from gitlease.ops.templates import install_spec_for

    vcs = json.dumps(
        {"url": "https://example.invalid/acme/gitlease.git", "vcs_info": {"vcs": "git", "commit_id": "c0ffee"}}
    )
    assert install_spec_for(vcs)[0] == "git+https://example.invalid/acme/gitlease.git@c0ffee"
    assert install_spec_for(None)[0] is None  # from an index: which one serves "gitlease" is not ours to guess
    checkout = make_repo("checkout")
    head = git(checkout, "rev-parse", "HEAD").strip()
    url = json.dumps({"url": checkout.as_uri(), "dir_info": {"editable": True}})
    spec, why = install_spec_for(url)
    assert spec is None and "on no remote branch" in why  # a commit only this machine has
    git(checkout, "remote", "add", "local", str(tmp_path))
    git(checkout, "update-ref", "refs/remotes/local/main", head)
    assert install_spec_for(url)[0] is None  # a runner cannot clone a local path
    git(checkout, "remote", "add", "origin", "git@example.invalid:acme/gitlease.git")
    git(checkout, "update-ref", "refs/remotes/origin/main", head)
    assert install_spec_for(url)[0] == f"git+ssh://git@example.invalid/acme/gitlease.git@{head}"

    repo = make_repo("project")
    res = cli(repo, "ci", "install", "github", "--json")
    if res.returncode == 0:  # this gitlease came from a clonable commit: pinned to it
        text = (repo / ".github/workflows/gitlease-sweep.yml").read_text()
        assert re.search(r'pip install --quiet "git\+\S+@[0-9a-f]{40}"', text), text
    else:
        assert res.returncode == 2 and "--install SPEC" in res.stderr
        assert json.loads(res.stdout)["error"]["kind"] == "usage"
    assert "gitlease==0.1.0" not in res.stdout + res.stderr


def test_the_ci_jobs_sign_with_a_key_from_a_ci_secret(make_repo):
    repo = make_repo("project")
    res = cli(repo, "ci", "install", "github", "--install", "git+https://example.invalid/acme/gitlease@v1")
    assert res.returncode == 0, res.stderr
    assert "GITLEASE_SIGNING_KEY" in res.stdout and "git lease keygen --agent gitlease-sweeper-github" in res.stdout
    text = (repo / ".github/workflows/gitlease-sweep.yml").read_text()
    assert "${{ secrets.GITLEASE_SIGNING_KEY }}" in text and "git config --global lease.signingKey" in text
    assert text.index("lease.signingKey") < text.index("git lease sweep-stale")
    res = cli(repo, "ci", "install", "gitlab", "--install", "git+https://example.invalid/acme/gitlease@v1")
    assert res.returncode == 0 and "File-type CI/CD variable GITLEASE_SIGNING_KEY" in res.stdout
    text = (repo / ".gitlab/gitlease-sweep.yml").read_text()
    assert 'install -m 600 "$GITLEASE_SIGNING_KEY"' in text


def test_init_without_a_terminal_says_how_to_create_the_key_and_yes_creates_it(make_repo, tmp_path):
    repo, _ = _remote_repo(make_repo, tmp_path)
    res = cli(repo, "init", "--agent", "worker-1", input="")
    assert res.returncode == 0 and "re-run with --yes" in res.stdout and "without a terminal" in res.stdout
    assert not (repo / ".gitlease" / "allowed_signers").exists()
    res = cli(repo, "init", "--agent", "worker-1", "--yes", input="")
    assert res.returncode == 0 and "key: set: created" in res.stdout, res.stdout
    assert "--yes answered yes: create an Ed25519 signing key for worker-1" in res.stdout
    # the remote has no branch yet to hold the trust: said, with what to run once it has
    assert "trust: todo: " in res.stdout and "has no default branch" in res.stdout, res.stdout
    assert "git lease trust add" in res.stdout


def test_init_agents_sets_up_a_signed_fleet_with_one_trust_line(make_repo, tmp_path, isolated_git):
    """Three agents on this host, one key, one trust line in the host's file, one commit; each agent signs as itself and
    every reader verifies it; an agent outside the fleet is refused before it writes."""
    repo, bare = _remote_repo(make_repo, tmp_path)
    git(repo, "push", "-q", bare.as_uri(), "HEAD:refs/heads/main")
    git(bare, "symbolic-ref", "HEAD", "refs/heads/main")
    res = cli(repo, "init", "--agents", "agent-1..3", "--yes", "--json", input="")
    assert res.returncode == 0, res.stderr
    steps = {s["name"]: s for s in json.loads(res.stdout)["result"]["steps"]}
    assert "agent-1, agent-2, agent-3" in steps["agents"]["detail"] and steps["key"]["status"] == "set"
    assert steps["trust"]["status"] == "set"  # published: this host's signer file, one commit on main
    (signer,) = git(bare, "ls-tree", "--name-only", "main", ".gitlease/signers/").split()
    lines = git(bare, "show", f"main:{signer}").splitlines()
    assert len(lines) == 1 and lines[0].startswith('agent-1,agent-2,agent-3 namespaces="gitlease" ssh-ed25519 ')
    again = cli(repo, "init", "--agents", "agent-1..3", "--yes", "--json", input="")
    assert json.loads(again.stdout)["result"]["changed"] is False  # idempotent
    got = {}
    for n in (1, 2, 3):
        res = cli(repo, "acquire", "-s", f"pkg{n}", "--agent", f"agent-{n}", "--json")
        got[n] = _lease(res)
    res = cli(repo, "status")
    assert res.stdout.startswith("signed: trust from .gitlease/signers/ (1 file)")
    assert res.stdout.count("[held here]") == 3 and "INVALID" not in res.stdout and "[unsigned]" not in res.stdout
    assert cli(repo, "show", got[2]).returncode == 0
    res = cli(repo, "acquire", "-s", "pkg4", "--agent", "agent-4")
    assert res.returncode == 5 and "it is trusted as agent-1, agent-2, agent-3" in res.stderr
    assert cli(repo, "init", "--agents", "bad name", input="").returncode == 2


# ---------------------------------------------------------------------------------------------- item 17


def test_worktree_list_calls_a_worktree_with_a_shell_in_it_busy_not_dirty(make_repo):
    import subprocess
    import sys

    repo = make_repo("a")
    res = cli(repo, "acquire", "-s", "docs", "--worktree", "--json")
    path = json.loads(res.stdout)["result"]["worktree"]["path"]
    shell = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=path, stdin=subprocess.PIPE)
    try:
        row = next(ln for ln in cli(repo, "worktree", "list").stdout.splitlines() if ln.startswith("wt-docs-1"))
        assert f"busy: process {shell.pid} has its working directory in it" in row and "dirty" not in row
    finally:
        shell.communicate(b"")


# ---------------------------------------------------------------------------------------------- items 13, 14


def test_dangerous_flags_have_no_negative_twin_and_holder_pid_is_in_the_help(make_repo):
    repo = make_repo("a")
    assert cli(repo, "release", "lease_01m8vf6hkhda1tsp", "--no-force").returncode == 2
    assert "--no-force" not in cli(repo, "release", "-h").stdout
    assert "--holder-pid" in cli(repo, "acquire", "-h").stdout


def test_the_docs_carry_no_stale_markers_and_no_raw_troff():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        assert not re.search(r"\bissues? #?\d+", text, re.I), doc.name  # a reader does not know what issue 19 is
        assert "what gitlease does today" not in text and "per-lease renewals (today)" not in text, doc.name
        assert not re.search(r"(^|\s)\.PP(\s|$)", text), doc.name  # roff belongs in the man page only
    cli_md = (root / "docs" / "cli.md").read_text(encoding="utf-8")
    from gitlease.cli import COMMANDS

    for name in COMMANDS:
        assert f"\n## {name}" in cli_md, name  # every command has its section
    for code in (0, 1, 2, 3, 4, 5, 6, 130):
        assert f"\n| {code} |" in cli_md
