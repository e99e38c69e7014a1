"""Group commit for pushes (gitlease/core/pushgroup.py), over a real bare remote: claims that meet while a push is
under way go together in the next push; a group the server refuses is pushed again one by one, so each claim
lands exactly when it would have alone and hears its own refusal.

The server's pre-receive is the seam: the push that finds a BLOCK file waits for the test (a FIFO) before it
is let through, and every push is logged with the refs it updates."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from conftest import git

from gitlease.core.config import resolve
from gitlease.core.errors import HeldError
from gitlease.core.pushgroup import PushGroup
from gitlease.core.repo import Repo
from gitlease.service.leases import LeaseService
from testing.servers import make_bare

HOOK = """#!/bin/sh
refs=$(cat)
if [ -e "{dir}/BLOCK" ]; then
    rm "{dir}/BLOCK"
    echo waiting >> "{dir}/events"
    cat "{dir}/gate" > /dev/null
fi
printf '%s\\n--\\n' "$refs" >> "{dir}/pushes"
"""


class Server:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "server"
        self.dir.mkdir()
        self.bare = make_bare(tmp / "remote.git")
        hook = self.bare / "hooks" / "pre-receive"
        hook.write_text(HOOK.format(dir=self.dir))
        hook.chmod(0o755)
        os.mkfifo(self.dir / "gate")
        self.clone = tmp / "clone"
        git(tmp, "clone", "-q", str(self.bare), str(self.clone))
        git(self.clone, "commit", "-q", "--allow-empty", "-m", "init")
        git(self.clone, "push", "-q", "origin", "HEAD:main")
        git(self.clone, "config", "lease.remote", "origin")
        (self.dir / "pushes").write_text("")

    def service(self, group: PushGroup | None, agent: str = "agent-a") -> LeaseService:
        repo = Repo.discover(self.clone)
        svc = LeaseService(repo, resolve(repo.config, env={}, agent=agent, task="t"))
        svc.store.group = group
        return svc

    def block_next(self) -> None:
        (self.dir / "BLOCK").write_text("")

    def wait_blocked(self) -> None:
        events = self.dir / "events"
        while not (events.exists() and "waiting" in events.read_text()):  # polling the real hook process
            threading.Event().wait(0.01)
        events.unlink()

    def open_gate(self) -> None:
        with open(self.dir / "gate", "w"):
            pass

    def pushes(self) -> list[list[str]]:
        """The refs of each push the server let through, in order."""
        text = (self.dir / "pushes").read_text()
        return [
            [line.split()[2] for line in chunk.strip().splitlines()] for chunk in text.split("--\n") if chunk.strip()
        ]


def _acquire(svc: LeaseService, scope: str, got: dict) -> None:
    try:
        got[scope] = svc.acquire([scope]).lease_id
    except HeldError as exc:
        got[scope] = exc


def _meet(server: Server, group: PushGroup, first: str, others: list[str], got: dict) -> None:
    """``first`` is acquired with its push held at the server; ``others`` are asked for meanwhile (all of them
    waiting in the group) before the server lets the first one through."""
    server.block_next()
    threads = [threading.Thread(target=_acquire, args=(server.service(group), first, got))]
    threads[0].start()
    server.wait_blocked()
    for scope in others:
        t = threading.Thread(target=_acquire, args=(server.service(group), scope, got))
        t.start()
        threads.append(t)
    while group.members < 1 + len(others):  # polling the other threads until each is in the group, waiting
        threading.Event().wait(0.01)
    server.open_gate()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()


def test_claims_that_meet_while_a_push_is_under_way_go_in_one_push(tmp_path):
    server, group = Server(tmp_path), PushGroup()
    got: dict = {}
    _meet(server, group, "a", ["b", "c", "d"], got)
    assert all(isinstance(v, str) for v in got.values()), got
    pushes = server.pushes()
    assert len(pushes) == 2 and group.pushes == 2, pushes
    second = pushes[1]
    assert sorted(r for r in second if r.startswith("refs/leases/scope/")) == [
        "refs/leases/scope/b",
        "refs/leases/scope/c",
        "refs/leases/scope/d",
    ]
    assert sorted(r.removeprefix("refs/leases/id/") for r in second if r.startswith("refs/leases/id/")) == sorted(
        got[s] for s in "bcd"
    )
    # each holds what it asked for, on the store
    refs = git(server.bare, "for-each-ref", "--format=%(refname)", "refs/leases/").split()
    assert {f"refs/leases/scope/{s}" for s in "abcd"} <= set(refs)


def test_a_refused_group_is_pushed_again_one_by_one_and_only_the_one_refused_hears_it(tmp_path):
    server, group = Server(tmp_path), PushGroup()
    holder = server.service(None, agent="agent-z").acquire(["e"]).lease_id  # held by another, not in the group
    got: dict = {}
    _meet(server, group, "h", ["e/x", "g"], got)  # e/x lies inside the held lease: the group's push is refused
    assert isinstance(got["h"], str) and isinstance(got["g"], str), got
    assert isinstance(got["e/x"], HeldError) and "agent-z" in got["e/x"].message, got["e/x"].message
    assert f"refs/leases/id/{holder}" in git(server.bare, "for-each-ref", "refs/leases/id/")
    refs = git(server.bare, "for-each-ref", "--format=%(refname)", "refs/leases/").split()
    assert {"refs/leases/scope/h", "refs/leases/scope/g", f"refs/leases/id/{got['g']}"} <= set(refs), refs
    assert not any(r.startswith("refs/leases/scope/e/") for r in refs), refs
    assert group.pushes >= 4  # h; e/x with g, refused; then each again alone (3 without a group)


def test_a_push_alone_waits_for_nobody(tmp_path):
    server, group = Server(tmp_path), PushGroup()
    got: dict = {}
    _acquire(server.service(group), "solo", got)
    assert isinstance(got["solo"], str) and group.pushes == 1 and len(server.pushes()) == 1


def test_claims_wait_for_a_push_that_goes_first_then_go_together(tmp_path):
    """The runner's landing push goes first (PushGroup.first): claims that come while it is under way wait for
    its end instead of competing with it at the server, then go in one push."""
    server, group = Server(tmp_path), PushGroup()
    got: dict = {}
    with group.first():
        threads = [threading.Thread(target=_acquire, args=(server.service(group), s, got)) for s in ("p", "q")]
        for t in threads:
            t.start()
        while group.members < 2:  # polling the threads until both are in the group
            threading.Event().wait(0.01)
        assert server.pushes() == [] and got == {}  # both wait for the push that goes first
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert all(isinstance(v, str) for v in got.values()), got
    pushes = server.pushes()
    assert len(pushes) == 1 and group.pushes == 1, pushes
    assert {"refs/leases/scope/p", "refs/leases/scope/q"} <= set(pushes[0])
