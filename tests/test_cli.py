"""The real ``git lease`` executable, dispatched by real git, in real repositories."""

import json
import re

from conftest import cli, git


def test_acquire_refuse_renew_release_output(make_repo, tmp_path):
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    a, b = make_repo("a"), make_repo("b")
    for r in (a, b):
        git(r, "config", "lease.remote", bare.as_uri())
    res = cli(
        a,
        "acquire",
        "--scope",
        "services/billing",
        "--scope",
        "libs/tax",
        "--task",
        "job_4821",
        "--agent",
        "codex-worker-4",
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert re.fullmatch(r"lease acquired: lease_[0-9a-z]{16}", lines[0])
    assert lines[1] == "workspace: a" and lines[2] == "ttl: 300s"
    lease = lines[0].split(": ")[1]

    res = cli(b, "acquire", "--scope", "services", "--agent", "other")
    assert res.returncode == 3
    assert lease in res.stderr and "job_4821" in res.stderr and "codex-worker-4" in res.stderr
    assert "\n" not in res.stderr.strip() and "Traceback" not in res.stderr

    res = cli(b, "acquire", "--scope", "services/tax", "--json")
    env = json.loads(res.stdout)
    assert res.returncode == 0 and env["ok"] and env["result"]["paths"] == ["services/tax"]

    res = cli(a, "renew", lease)
    assert res.returncode == 0 and re.fullmatch(r"lease renewed: version=2 expiresAt=\S+Z\n", res.stdout)

    res = cli(b, "status", "--json")
    leases = json.loads(res.stdout)["result"]["leases"]
    assert {tuple(x["paths"]) for x in leases} == {("libs/tax", "services/billing"), ("services/tax",)}
    res = cli(b, "status")
    assert lease in res.stdout and "codex-worker-4" in res.stdout and "left" in res.stdout

    res = cli(a, "show", lease)
    assert res.returncode == 0 and "history:" in res.stdout and "v2" in res.stdout and "v1" in res.stdout

    res = cli(b, "release", lease, "--json")
    env = json.loads(res.stdout)
    assert res.returncode == 1 and not env["ok"] and env["error"]["kind"] == "not-held"

    res = cli(a, "release", lease)
    assert res.returncode == 0 and res.stdout == f"lease released: {lease}\n"
    assert cli(b, "can-start", "--scope", "services").returncode == 3  # services/tax is still held
    assert cli(b, "can-start", "--scope", "services/billing").returncode == 0


def test_usage_errors(make_repo):
    a = make_repo("a")
    for bad in ("/abs", "../up", ".git/x", "", "a\tb"):
        res = cli(a, "acquire", "--scope", bad, "--json")
        assert res.returncode == 2, (bad, res.stderr)
        env = json.loads(res.stdout)
        assert env["error"]["kind"] == "invalid-scope" and "Traceback" not in res.stderr
    res = cli(a, "acquire")
    assert res.returncode == 2
    res = cli(a, "acquire", "--scope", "x", "--ttl", "soon")
    assert res.returncode == 2 and "ttl" in res.stderr  # a bad option value is a usage error
    assert cli(a, "-h").returncode == 0 and "acquire" in cli(a, "-h").stdout
    assert cli(a, "renew", "-h").returncode == 0


def test_not_a_repository(tmp_path):
    res = cli(tmp_path, "status")
    assert res.returncode != 0 and "Traceback" not in res.stderr


def test_status_answers_stale_when_remote_unreachable(make_repo, tmp_path):
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    a = make_repo("a")
    git(a, "config", "lease.remote", bare.as_uri())
    lease = cli(a, "acquire", "--scope", "x").stdout.splitlines()[0].split(": ")[1]
    assert cli(a, "status").returncode == 0
    bare.rename(tmp_path / "gone.git")
    res = cli(a, "status", "--json")
    env = json.loads(res.stdout)
    assert res.returncode == 0 and env["result"]["stale"] is True and env["result"]["leases"][0]["leaseId"] == lease
    res = cli(a, "status")
    assert "unreachable" in res.stdout and lease in res.stdout
    res = cli(a, "acquire", "--scope", "y")  # writes fail closed
    assert res.returncode == 1 and "Traceback" not in res.stderr
    res = cli(a, "renew", lease)
    assert res.returncode != 0


def test_local_store_default(make_repo):
    a = make_repo("a")
    res = cli(a, "acquire", "--scope", ".", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["result"]["store"] == "local"
    assert "refs/leases/scope" in git(a, "for-each-ref", "refs/leases/")


def test_missing_signing_key_file_is_a_clear_error(make_repo):
    a = make_repo("a")
    git(a, "config", "lease.signingKey", "/nonexistent/key")
    res = cli(a, "acquire", "--scope", "x")
    assert res.returncode == 1 and "signing key /nonexistent/key: no such file" in res.stderr
    assert "Traceback" not in res.stderr


def test_acquire_replace_releases_the_finished_lease(make_repo):
    a = make_repo("a")
    first = cli(a, "acquire", "--scope", "one").stdout.splitlines()[0].split(": ")[1]
    res = cli(a, "acquire", "--scope", "two", "--replace", first, "--json")
    assert res.returncode == 0, res.stderr
    assert [v["paths"] for v in json.loads(cli(a, "status", "--json").stdout)["result"]["leases"]] == [["two"]]
    res = cli(a, "acquire", "--scope", "three", "--replace", "lease_nosuch0000000000")
    assert res.returncode == 1 and "not held by this worktree" in res.stderr
