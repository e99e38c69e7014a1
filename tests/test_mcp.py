"""``git lease mcp`` end to end: the real command in a subprocess, driven by the MCP SDK's own client over stdio
(``stdio_client`` + ``ClientSession``), against real repositories and leases."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, cli, git
from test_hooks import acquire

mcp = pytest.importorskip("mcp")
anyio = pytest.importorskip("anyio")

TOOLS = {
    "lease_status",
    "lease_can_start",
    "lease_plan",
    "lease_acquire",
    "lease_extend",
    "lease_check_paths",
    "lease_progress",
    "lease_push",
    "lease_release",
}


def talk(repo, body, *args):
    """Start ``git lease mcp ARGS`` in ``repo``, run ``body(session)`` with an initialised client session, and
    end the session (the client closes the server's stdin, as an MCP client does)."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    params = StdioServerParameters(command="git", args=["lease", "mcp", *args], cwd=str(repo), env=env)

    async def main():
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await body(session)

    return anyio.run(main)


async def call(session, name, **args):
    res = await session.call_tool(name, args)
    text = res.content[0].text if res.content else ""
    return res.is_error, (text if res.is_error else json.loads(text))


def test_tools_have_schemas_and_a_session_holds_renews_and_releases(make_repo):
    repo = make_repo("w")
    other = repo.parent / "other"
    git(repo, "worktree", "add", "-q", "--detach", str(other))
    theirs = acquire(other, "libs/tax", agent="codex-7", task="job-9")
    seen = {}

    async def body(s):
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert set(tools) == TOOLS
        assert tools["lease_acquire"].input_schema["properties"]["paths"]["type"] == "array"
        assert tools["lease_extend"].input_schema["required"] == ["lease", "paths"]
        err, got = await call(s, "lease_acquire", paths=["src"], task="t-1", ttl=120)
        assert not err, got
        lease = got["leaseId"]
        seen["lease"] = lease
        assert got["paths"] == ["src"] and got["renewedBySession"]
        # the resource shows the boundary: this worktree's leases, scope, time left
        (res,) = (await s.list_resources()).resources
        assert str(res.uri) == "gitlease://leases"
        doc = json.loads((await s.read_resource(res.uri)).contents[0].text)
        (row,) = doc["leases"]
        assert row["leaseId"] == lease and row["paths"] == ["src"] and 0 < row["secondsLeft"] <= 120
        # per path: yours, free, held by whom
        err, got = await call(s, "lease_check_paths", paths=["src/a.py", "docs/x.md", "libs/tax/r.py"])
        rows = {r["path"]: r for r in got["paths"]}
        assert rows["src/a.py"]["status"] == "yours" and rows["src/a.py"]["writable"]
        assert rows["docs/x.md"]["status"] == "free" and not rows["docs/x.md"]["writable"]  # strict: extend first
        held = rows["libs/tax/r.py"]
        assert held["status"] == "held" and held["leaseId"] == theirs and held["holder"]["agent"] == "codex-7"
        # errors are tool errors with the CLI's one-line message; the server goes on
        err, msg = await call(s, "lease_extend", lease=lease, paths=["libs"])
        assert err and msg.startswith("scope libs is held: ") and theirs in msg
        err, got = await call(s, "lease_extend", lease=lease, paths=["docs"])
        assert not err and got["paths"] == ["docs", "src"] and got["added"] == ["docs"]
        err, got = await call(s, "lease_can_start", paths=["libs/tax"])
        assert not err and got["free"] is False and got["blockers"][0]["leaseId"] == theirs
        err, got = await call(s, "lease_progress", note="tests 3/10")
        assert not err and got["leases"] == [lease]
        err, msg = await call(s, "lease_release", lease="lease_nothere0")  # the CLI's words for a typo
        assert err and "this worktree never held it" in msg
        err, msg = await call(s, "lease_release", lease=theirs)  # held elsewhere: who holds it, and where
        assert err and "is not held by this worktree" in msg and str(other) in msg
        err, got = await call(s, "lease_status")
        mine = [x for x in got["leases"] if x["leaseId"] == lease]
        assert mine[0]["renewedBySession"] and mine[0]["heldHere"]
        err, got = await call(
            s, "lease_plan", tasks=[{"id": "a", "scope": ["libs"]}, {"id": "b", "paths": ["zz/y.py"]}]
        )
        assert not err and got["start"] == ["b"] and got["blocked"][0]["leases"] == [theirs]
        return lease

    lease = talk(repo, body)
    # the session ended: what it acquired was released; the other worktree's lease is untouched
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/leases/").split()
    assert f"refs/leases/id/{lease}" not in refs and f"refs/leases/id/{theirs}" in refs
    assert seen["lease"] == lease


def test_keep_on_exit_and_release_tool(make_repo):
    repo = make_repo("w")

    async def body(s):
        err, a = await call(s, "lease_acquire", paths=["a"])
        err2, b = await call(s, "lease_acquire", paths=["b"])
        assert not err and not err2
        err, got = await call(s, "lease_release", lease=a["leaseId"])
        assert not err and got["released"] and not got["already"]
        err, got = await call(s, "lease_release", lease=a["leaseId"])  # idempotent, as the CLI's release is
        assert not err and got["released"] and got["already"], got
        return b["leaseId"]

    kept = talk(repo, body, "--on-exit", "keep")
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/leases/id/").split()
    assert refs == [f"refs/leases/id/{kept}"]  # released by the tool: gone; the other kept until it expires
    assert cli(repo, "release", kept).returncode == 0


def test_push_is_fenced(tmp_path, make_repo):
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    seed = make_repo("seed")
    git(seed, "push", "-q", bare.as_uri(), "HEAD:main")
    repo = tmp_path / "clone"
    git(tmp_path, "clone", "-q", bare.as_uri(), str(repo))
    git(repo, "config", "lease.remote", "origin")

    async def body(s):
        err, got = await call(s, "lease_acquire", paths=["src"])
        assert not err, got
        (repo / "src").mkdir()
        (repo / "src" / "a.py").write_text("x\n")
        git(repo, "add", ".")
        git(repo, "commit", "-q", "--no-verify", "-m", "a")
        err, pushed = await call(s, "lease_push", branch="main")
        assert not err and pushed["version"] >= 2 and pushed["targets"][0]["dst"] == "refs/heads/main", pushed
        err, msg = await call(s, "lease_push", branch="+main")
        assert err and "drop the '+'" in msg
        (repo / "docs").mkdir()
        (repo / "docs" / "x.md").write_text("stray\n")
        git(repo, "add", ".")
        git(repo, "commit", "-q", "--no-verify", "-m", "stray")
        err, msg = await call(s, "lease_push", branch="main")  # scope-checked like git lease push: nothing lands
        assert err and "docs/x.md" in msg, msg
        git(repo, "reset", "-q", "--hard", "HEAD~1")
        return got["leaseId"]

    talk(repo, body)
    assert git(bare, "rev-parse", "main").strip() == git(repo, "rev-parse", "HEAD").strip()


def test_initialize_imports_no_sdk_and_opens_no_service(make_repo, tmp_path):
    """``initialize`` is answered before anything heavy is imported (a client asks for the tools right away:
    an SDK import of seconds left the first request without them): no mcp, pydantic or service modules, and
    the session opens on the first tool call."""
    repo = make_repo("w")
    code = (
        "import io, json, sys; sys.path.insert(0, sys.argv[1]); from gitlease.mcp.server import Server; "
        "out = io.BytesIO(); "
        "req = {'jsonrpc': '2.0', 'id': 1, 'method': 'initialize', 'params': {'protocolVersion': '2025-06-18'}}; "
        "Server(lambda: 1 / 0, io.BytesIO((json.dumps(req) + '\\n').encode()), out).run(); "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'pydantic', 'typer', 'anyio') "
        "or m in ('gitlease.mcp.session', 'gitlease.service.leases')); "
        "print(json.loads(out.getvalue())['result']['protocolVersion'], heavy)"
    )
    res = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=repo, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "2025-06-18 []", res.stderr


def test_arguments_are_checked_and_errors_carry_kind_holders_and_exit_code(make_repo):
    repo = make_repo("w")
    other = repo.parent / "other"
    git(repo, "worktree", "add", "-q", "--detach", str(other))
    theirs = acquire(other, "docs", agent="b", task="tb")

    async def body(session):
        got = {}
        for name, args in (
            ("ttl", {"paths": ["src"], "ttl": 10**12}),
            ("unknown", {"paths": ["src"], "colour": "red"}),
            ("type", {"paths": "src"}),
            ("held", {"paths": ["docs/a.md"]}),
        ):
            res = await session.call_tool("lease_acquire", args)
            got[name] = (res.is_error, res.content[0].text, res.structured_content)
        return got

    got = talk(repo, body)
    assert got["ttl"][:2] == (True, f"lease_acquire: ttl must be at least 5 and at most {366 * 86400}, not {10**12}")
    assert got["ttl"][2]["error"]["kind"] == "usage" and got["ttl"][2]["error"]["exitCode"] == 2
    assert got["unknown"][1] == "lease_acquire: unknown argument colour (it takes: paths, task, ttl, worktree)"
    assert got["type"][1] == "lease_acquire: paths must be array, not str"
    error = got["held"][2]["error"]
    assert got["held"][0] and error["kind"] == "held" and error["exitCode"] == 3
    assert [h["leaseId"] for h in error["holders"]] == [theirs] and theirs in got["held"][1]


def test_session_renews_what_it_acquired_and_releases_it_at_the_end(tmp_path):
    """The session's heartbeat (hold()'s machinery) on an injected clock: a renewal carries the progress note;
    the end of the session releases the lease, or keeps it (on_exit="keep")."""
    from helpers import Fleet
    from test_heartbeat import GatedClock

    from gitlease.core.config import resolve
    from gitlease.core.repo import Repo
    from gitlease.mcp.session import Session
    from gitlease.service.leases import LeaseService

    for on_exit in ("release", "keep"):
        clock = GatedClock()
        (tmp_path / on_exit).mkdir()
        where = Fleet(tmp_path / on_exit, None, clock).path("a")

        def open_service(path, remote=None, clock=clock, **flags):
            repo = Repo.discover(path)
            return LeaseService(repo, resolve(repo.config, env={}, agent="a", **flags), clock=clock)

        s = Session(str(where), on_exit=on_exit, open_service=open_service)
        got = s.acquire(["svc"], task="t-1", ttl=60)
        clock.wait_parked(1)
        s.progress("step 1/3")
        clock.step()
        clock.wait_parked(2)  # renewed once, waiting for the next interval
        view = s.svc.snapshot().find(got["leaseId"])
        assert view.record.version == 2 and view.record.progress.note == "step 1/3"
        assert view.record.owner.task_id == "t-1"
        for beat in s.held.values():
            beat.heartbeat.stop()
        clock.step()  # the parked heartbeat wakes, sees the stop, and ends
        assert s.close() == []
        left = s.svc.store.list_refs()
        assert (left == {}) == (on_exit == "release")


def test_acquire_with_a_worktree_of_its_own(make_repo):
    repo = make_repo("w")

    async def body(s):
        err, got = await call(s, "lease_acquire", paths=["svc"], worktree=True)
        assert not err, got
        assert got["worktree"] and os.path.isdir(got["worktree"])
        doc = json.loads((await s.read_resource("gitlease://leases")).contents[0].text)
        assert any(row["leaseId"] == got["leaseId"] and row.get("worktree") for row in doc["leases"])
        err, ext = await call(s, "lease_extend", lease=got["leaseId"], paths=["docs"])
        assert not err and ext["paths"] == ["docs", "svc"]
        return got

    got = talk(repo, body)
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/leases/").split()
    assert refs == []  # released at the end of the session, from the worktree that holds it
    assert os.path.isdir(got["worktree"])  # releasing a lease never removes its worktree
