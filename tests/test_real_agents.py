"""The fence with the real clients (Claude Code, Codex CLI, Gemini CLI), each driven by a scripted model server
on loopback (testing/fakemodel.py): every tool call is the client's own, and what a model would see is read
from the request that carries the tool's result. ``make test-agents`` installs the clients from the npm
registry and runs this file; without them (``make test``) it is skipped.
"""

import json
import os
import statistics
import sys

import pytest
from conftest import ROOT, cli, git
from test_hooks import acquire

from testing.agentclients import RUN, client_bin
from testing.fakemodel import FakeModel, Step

pytestmark = pytest.mark.skipif(
    not os.environ.get("GITLEASE_AGENT_CLIENTS"), reason="the real agent clients: make test-agents"
)


def patch(path):
    return "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: " + path + "\n+x = 1\n*** End Patch\nEOF\n"


# How each client's model writes a file and runs a command; what it must be told; its settings file.
CLIENT = {
    "claude": {
        "write": lambda repo, p: Step("Write", {"file_path": str(repo / p), "content": "x = 1\n"}),
        "shell": lambda cmd: Step("Bash", {"command": cmd, "description": "run it"}),
        "settings": ".claude/settings.local.json",
        "args": (),
    },
    "codex": {
        "write": lambda repo, p: Step("exec_command", {"cmd": patch(p)}),
        "shell": lambda cmd: Step("exec_command", {"cmd": cmd}),
        "settings": ".codex/hooks.json",
        # what a user does once in codex's TUI (trust the project, then the hooks in /hooks), for one run
        "args": ("--trust", "--dangerously-bypass-hook-trust"),
    },
    "gemini": {
        "write": lambda repo, p: Step("write_file", {"file_path": str(repo / p), "content": "x = 1\n"}),
        "shell": lambda cmd: Step("run_shell_command", {"command": cmd}),
        "settings": ".gemini/settings.json",
        "args": (),
    },
}


@pytest.fixture(params=sorted(CLIENT))
def agent(request, make_repo, isolated_git):
    name = request.param
    if client_bin(name) is None:
        pytest.skip(f"{name} is not installed (make test-agents)")
    repo = make_repo("work")
    lease = acquire(repo, "src")
    res = cli(repo, "agent-hooks", "install", name)
    assert res.returncode == 0, res.stderr
    home = isolated_git
    if name == "gemini":  # the folder trusted, an API key as the auth method: what a user sets up once
        (home / ".gemini").mkdir(exist_ok=True)
        (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(repo): "TRUST_FOLDER"}))
        (home / ".gemini" / "settings.json").write_text(
            json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}})
        )
    return name, repo, lease, home


def drive(agent, steps):
    name, repo, _, home = agent
    with FakeModel(steps) as fm:
        res = RUN[name](repo, home, fm, *CLIENT[name]["args"])
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-2000:])
    assert fm.calls == len(steps), (fm.seen, res.stderr[-2000:])
    return fm


def test_inside_passes_outside_refused_with_the_reason(agent):
    name, repo, lease, _ = agent
    c = CLIENT[name]
    fm = drive(agent, [c["write"](repo, "src/a.py"), c["write"](repo, "docs/b.md")])
    assert (repo / "src" / "a.py").exists() and not (repo / "docs" / "b.md").exists()
    told = fm.seen[1]
    assert "gitlease: edit refused: docs/b.md is outside this worktree's leases" in told, told
    assert f"git lease extend {lease} --scope docs/b.md" in told


def test_a_shell_command_outside_is_reported_and_its_output_kept(agent):
    name, repo, lease, _ = agent
    (repo / "stray.txt").write_text("there before the command\n")
    c = CLIENT[name]
    fm = drive(
        agent, [c["shell"]("echo hello-from-the-command; git status --short"), c["shell"]("echo made > notes.txt")]
    )
    first, second = fm.seen
    assert "hello-from-the-command" in first and "gitlease" not in first  # nothing this command changed
    assert "notes.txt (changed) is outside this worktree's leases" in second and "stray.txt" not in second
    assert git(repo, "status", "--porcelain", "--untracked-files=all").split() == ["??", "notes.txt", "??", "stray.txt"]


def test_the_fence_cannot_be_deleted(agent):
    name, repo, _, _ = agent
    c = CLIENT[name]
    settings = repo / c["settings"]
    before = settings.read_bytes()
    fm = drive(agent, [c["shell"](f"rm {c['settings']} && echo removed"), c["write"](repo, "docs/b.md")])
    # gitlease puts it back (Claude Code refuses the command itself: it guards its own settings in -p runs)
    put_back = "gitlease put it back as it was" in fm.seen[0] and "removed" in fm.seen[0]
    assert put_back or (name == "claude" and "requested permissions" in fm.seen[0]), fm.seen[0]
    assert settings.read_bytes() == before
    assert "edit refused: docs/b.md" in fm.seen[1] and not (repo / "docs" / "b.md").exists()
    c2 = CLIENT[name]["write"](repo, c["settings"])
    if name != "codex":  # codex edits by patch in a shell command: covered by the shell case above
        read = [Step("Read", {"file_path": str(settings)})] if name == "claude" else []  # Claude Code: read first
        fm = drive(agent, [*read, c2])
        fm.seen = fm.seen[len(read) :]
        assert "is an agent's hook settings" in fm.seen[0] and settings.read_bytes() == before


def first_json(text):
    """The JSON a tool returned (the client may append its own reminders after it)."""
    return json.JSONDecoder().raw_decode(text.lstrip())[0]


def test_mcp_tools_end_to_end_in_claude_code(make_repo, isolated_git, tmp_path):
    if client_bin("claude") is None:
        pytest.skip("claude is not installed (make test-agents)")
    repo = make_repo("work")
    config = tmp_path / "mcp.json"
    git_lease = os.path.join(os.path.dirname(sys.executable), "git-lease")
    config.write_text(json.dumps({"mcpServers": {"gitlease": {"command": git_lease, "args": ["mcp"]}}}))
    names = ",".join(f"mcp__gitlease__lease_{n}" for n in ("acquire", "check_paths", "status"))
    steps = [
        Step("ToolSearch", {"query": f"select:{names}"}),  # Claude Code defers MCP tools: the model loads them
        Step("mcp__gitlease__lease_acquire", {"paths": ["src"], "ttl": 600}),
        Step("mcp__gitlease__lease_check_paths", {"paths": ["src/a.py", "docs/b.md"]}),
        Step("mcp__gitlease__lease_acquire", {"paths": ["src"], "ttl": 10**12}),
        Step("mcp__gitlease__lease_status", {"bogus": 1}),
    ]
    with FakeModel(steps) as fm:
        res = RUN["claude"](repo, isolated_git, fm, "--mcp-config", str(config), "--strict-mcp-config")
    assert res.returncode == 0 and fm.calls == 5, (fm.seen, res.stderr[-2000:])
    fm.seen.pop(0)  # the schemas ToolSearch loaded
    got = first_json(fm.seen[0])
    assert got["paths"] == ["src"] and got["leaseId"].startswith("lease_")
    rows = {r["path"]: r["status"] for r in first_json(fm.seen[1])["paths"]}
    assert rows == {"src/a.py": "yours", "docs/b.md": "free"}
    assert "ttl" in fm.seen[2] and "at most" in fm.seen[2]  # validated at the boundary: a clear error
    assert "bogus" in fm.seen[3]  # unknown arguments refused


def test_the_guards_cost_inside_claude_code(make_repo, isolated_git):
    """Per edit inside the lease: the time from the tool call sent to its result received, with the hooks and
    without; written to GITLEASE_AGENT_COST (a JSON file) when set, for docs/performance.md."""
    if client_bin("claude") is None:
        pytest.skip("claude is not installed (make test-agents)")
    n = int(os.environ.get("GITLEASE_AGENT_EDITS", "30"))
    out = {}
    for label in ("without the hooks", "with the hooks"):
        repo = make_repo(label.replace(" ", "-"))
        acquire(repo, "src")
        if label == "with the hooks":
            assert cli(repo, "agent-hooks", "install", "claude").returncode == 0
        steps = [Step("Write", {"file_path": str(repo / f"src/f{i}.py"), "content": "x\n"}) for i in range(n)]
        with FakeModel(steps) as fm:
            res = RUN["claude"](repo, isolated_git, fm)
        assert res.returncode == 0 and fm.calls == n and all("created" in s for s in fm.seen), fm.seen[:3]
        gaps = sorted(g * 1000 for g in fm.gaps)
        out[label] = {"median": statistics.median(gaps), "p99": gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))]}
    if os.environ.get("GITLEASE_AGENT_COST"):
        with open(os.environ["GITLEASE_AGENT_COST"], "w") as fh:
            json.dump(dict(out, edits=n, root=str(ROOT)), fh)
    assert out["with the hooks"]["median"] >= 0
