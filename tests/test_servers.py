"""The test servers themselves: real clone/push/fetch/ls-remote over file://, git:// (git daemon) and smart
HTTP (git http-backend), lease-style compare-and-swap pushes, protocol v2, gzip and chunked HTTP bodies,
kill/restart on the same port, and a server that never answers (client timeouts)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
from servers import GitDaemon, HangingServer, SmartHTTPServer, _group_alive, free_port, make_bare

from testing.gitutil import run_git

LEASE_REF = "refs/leases/scope/a"


@pytest.fixture(autouse=True)
def git_env(isolated_git, monkeypatch):
    """conftest's isolation, plus no git tracing or protocol variables from the caller."""
    for var in ("GIT_TRACE_PACKET", "GIT_TRACE", "GIT_PROTOCOL"):
        monkeypatch.delenv(var, raising=False)
    return isolated_git


def git(cwd, *args, check=True, env=None, timeout=30, input=None) -> subprocess.CompletedProcess:
    return run_git(cwd, *args, check=check, env=env, timeout=timeout, input=input)


def lease_commit(repo, text: str) -> str:
    """A parentless commit holding one record file, like a lease record (not on any branch)."""
    blob = git(repo, "hash-object", "-w", "--stdin", input=text).stdout.strip()
    tree = git(repo, "mktree", input=f"100644 blob {blob}\trecord.json\n").stdout.strip()
    return git(repo, "commit-tree", tree, "-m", f"lease {text}").stdout.strip()


def push_lease(repo, url, new: str, old: str = "") -> subprocess.CompletedProcess:
    return git(
        repo,
        "push",
        "--atomic",
        "--porcelain",
        f"--force-with-lease={LEASE_REF}:{old}",
        url,
        f"{new}:{LEASE_REF}",
        check=False,
    )


def porcelain_flag(out: str, ref: str) -> str:
    for line in out.splitlines():
        if len(line) > 2 and line[1] == "\t" and line.split("\t")[1].endswith(":" + ref):
            return line[0]
    raise AssertionError(f"no porcelain line for {ref} in:\n{out}")


def test_clone_push_lease_cas_ls_remote_fetch_by_oid(remote, tmp_path):
    assert remote.url.startswith(
        {"file": "file:///", "daemon": "git://127.0.0.1:", "http": "http://127.0.0.1:"}[remote.kind]
    )
    assert (remote.path / "HEAD").exists()

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", remote.url, str(clone))  # empty repository
    (clone / "f").write_text("1\n")
    git(clone, "add", "f")
    git(clone, "commit", "-q", "-m", "one")
    first = git(clone, "rev-parse", "HEAD").stdout.strip()
    (clone / "f").write_text("2\n")
    git(clone, "commit", "-q", "-am", "two")
    git(clone, "push", "-q", "origin", "HEAD:refs/heads/main")

    l1, l2, l3 = (lease_commit(clone, f'{{"v": {i}}}') for i in (1, 2, 3))
    created = push_lease(clone, remote.url, l1)
    assert created.returncode == 0, created.stderr
    assert porcelain_flag(created.stdout, LEASE_REF) == "*"

    again = push_lease(clone, remote.url, l2)  # a second create: the ref exists now
    assert again.returncode != 0
    assert porcelain_flag(again.stdout, LEASE_REF) == "!"

    stale = push_lease(clone, remote.url, l3, old=l2)  # compare-and-swap against the wrong old value
    assert porcelain_flag(stale.stdout, LEASE_REF) == "!"

    swapped = push_lease(clone, remote.url, l2, old=l1)  # unrelated history: a forced, leased update
    assert swapped.returncode == 0, swapped.stderr
    assert porcelain_flag(swapped.stdout, LEASE_REF) == "+"

    listed = git(tmp_path, "ls-remote", remote.url).stdout
    refs = {ref: oid for oid, ref in (line.split("\t") for line in listed.splitlines())}
    assert refs[LEASE_REF] == l2
    assert refs["refs/heads/main"] != first
    # the server keeps a reflog for every ref (core.logAllRefUpdates=always)
    assert (remote.path / "logs" / LEASE_REF).read_text().count("\n") == 2

    fresh = tmp_path / "fresh"
    git(tmp_path, "init", "-q", str(fresh))
    # the tip, a reachable non-tip commit, and the lease's old commit (no ref points at it any more)
    for oid in (l2, first, l1):
        git(fresh, "fetch", "-q", "--no-write-fetch-head", remote.url, oid)
        git(fresh, "cat-file", "-e", oid)


def test_protocol_v2_over_http_and_daemon(remote_http, remote_daemon, http_server, git_daemon, tmp_path):
    trace = {"GIT_TRACE_PACKET": "1"}
    v2 = git(tmp_path, "-c", "protocol.version=2", "ls-remote", remote_http.url, env=trace)
    assert "< version 2" in v2.stderr
    assert http_server.requests()[-1]["git-protocol"] == "version=2"

    v0 = git(tmp_path, "-c", "protocol.version=0", "ls-remote", remote_http.url, env=trace)
    assert "< version 2" not in v0.stderr
    assert http_server.requests()[-1]["git-protocol"] == "-"

    d2 = git(tmp_path, "-c", "protocol.version=2", "ls-remote", remote_daemon.url, env=trace)
    assert "< version 2" in d2.stderr
    assert 'Extended attribute "protocol": version=2' in git_daemon.log_text()


def test_http_gzip_and_chunked_request_bodies(remote_http, http_server, tmp_path):
    # 60 branches on distinct commits, written straight into the bare repository: fetching them all sends
    # 60 "want" lines (> 1 KiB), which git gzips.
    script = "".join(
        f"commit refs/heads/b{i}\ncommitter T <t@x> {1700000000 + i} +0000\ndata 3\nc{i}\n\n" for i in range(60)
    )
    git(remote_http.path, "fast-import", "--quiet", input=script)
    fresh = tmp_path / "fresh"
    git(tmp_path, "init", "-q", str(fresh))
    git(fresh, "fetch", "-q", remote_http.url, "refs/heads/*:refs/remotes/o/*")
    assert len(git(fresh, "for-each-ref", "refs/remotes/o").stdout.splitlines()) == 60
    posts = [r for r in http_server.requests() if r["method"] == "POST" and r["path"].endswith("upload-pack")]
    assert posts[-1]["encoding"] == "gzip" and posts[-1]["status"] == "200"

    # A push bigger than http.postBuffer (at least 64 KiB) is sent chunked.
    (fresh / "big").write_bytes(os.urandom(300_000))
    git(fresh, "add", "big")
    git(fresh, "commit", "-q", "-m", "big")
    git(fresh, "-c", "http.postBuffer=65536", "push", "-q", remote_http.url, "HEAD:refs/heads/big")
    posts = [r for r in http_server.requests() if r["method"] == "POST" and r["path"].endswith("receive-pack")]
    assert posts[-1]["te"] == "chunked" and int(posts[-1]["in"]) > 300_000
    head = git(fresh, "rev-parse", "HEAD").stdout.strip()
    assert head in git(tmp_path, "ls-remote", remote_http.url, "refs/heads/big").stdout


@pytest.mark.parametrize("cls", [GitDaemon, SmartHTTPServer], ids=["daemon", "http"])
def test_kill_and_restart_on_same_port(cls, tmp_path):
    server = cls(tmp_path / "base")
    with server:
        port = server.port
        server.make_bare("r.git")
        url = server.url_for("r.git")
        work = tmp_path / "work"
        git(tmp_path, "init", "-q", str(work))
        git(work, "commit", "-q", "--allow-empty", "-m", "x")
        git(work, "push", "-q", url, "HEAD:refs/heads/main")

        # A connection that is open but silent: git daemon forks a child for it and waits.
        held = socket.create_connection(("127.0.0.1", port))
        pgid = server.pid
        server.kill()
        assert not _group_alive(pgid)  # the per-connection children went too
        held.close()
        down = git(tmp_path, "ls-remote", url, check=False, timeout=10)
        assert down.returncode != 0

        server.restart()
        assert server.port == port and server.running
        assert "refs/heads/main" in git(tmp_path, "ls-remote", url).stdout
        pgid = server.pid
    assert not server.running and not _group_alive(pgid)  # __exit__ stopped the group


def test_hanging_server_makes_clients_time_out(tmp_path):
    with HangingServer() as hang:
        assert hang.url == f"git://127.0.0.1:{hang.port}/x"
        procs = [
            subprocess.Popen(
                ["git", "ls-remote", url],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            for url in (hang.url, hang.http_url)
        ]
        deadline = time.monotonic() + 3
        timed_out = []
        for proc in procs:
            try:
                proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
                timed_out.append(False)
            except subprocess.TimeoutExpired:
                timed_out.append(True)
                os.killpg(proc.pid, signal.SIGKILL)  # git and its remote helper
                proc.communicate()
        assert timed_out == [True, True]
        assert hang.connections >= 2


def test_make_bare_settings(tmp_path):
    path = make_bare(tmp_path / "a.git")
    cfg = lambda p, k: git(p, "config", "--get", k, check=False).stdout.strip()  # noqa: E731
    assert cfg(path, "core.bare") == "true"
    assert cfg(path, "core.logAllRefUpdates") == "always"
    assert cfg(path, "http.receivepack") == "true"
    assert cfg(path, "receive.advertisePushOptions") == "true"
    quiet = make_bare(tmp_path / "b.git", log_all_ref_updates=False)
    assert cfg(quiet, "core.logAllRefUpdates") == ""
    assert free_port() != free_port()
