"""``make demo``: a temporary repository with a bare remote, three agents with overlapping and disjoint
scopes, who got what and who was refused; then the pipeline, ``git lease work``: a queue run by three fake
agents, one task refused by a lease and run later, one stray edit refused at landing, the summary; then
everything is cleaned up.

It drives the real ``git lease`` executable through real git, as an agent would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time


def _git(cwd: str, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _lease(cwd: str, *args: str) -> tuple[int, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    res = subprocess.run(["git", "lease", *args], cwd=cwd, capture_output=True, text=True, env=env)
    return res.returncode, (res.stdout + res.stderr).strip()


def main() -> int:
    base = tempfile.mkdtemp(prefix="gitlease-demo-")
    try:
        remote = os.path.join(base, "remote.git")
        _git(base, "init", "-q", "--bare", "--initial-branch=main", remote)
        seed = os.path.join(base, "seed")
        _git(base, "init", "-q", "--initial-branch=main", seed)
        for path in ("services/billing/api.py", "services/tax/rates.py", "libs/tax/calc.py"):
            os.makedirs(os.path.join(seed, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(seed, path), "w") as fh:
                fh.write("# demo\n")
        _git(seed, "add", ".")
        _git(seed, "-c", "user.name=demo", "-c", "user.email=demo@example.invalid", "commit", "-q", "-m", "seed")
        _git(seed, "push", "-q", remote, "HEAD:refs/heads/main")
        print(f"demo repository with a bare remote in {base}\n")

        agents = {}
        for name in ("agent-1", "agent-2", "agent-3"):
            path = os.path.join(base, name)
            _git(base, "clone", "-q", remote, path)
            _git(path, "config", "lease.remote", "origin")
            agents[name] = path

        plan = [
            ("agent-1", "job_1", ["services/billing", "libs/tax"]),
            ("agent-2", "job_2", ["services"]),  # overlaps agent-1: refused
            ("agent-3", "job_3", ["services/tax"]),
        ]  # disjoint from agent-1: granted at once
        held = {}
        for name, task, scopes in plan:
            args = ["acquire", "--agent", name, "--task", task]
            for s in scopes:
                args += ["--scope", s]
            print(f"$ git lease {' '.join(args)}    # in {name}")
            code, out = _lease(agents[name], *args)
            print(out)
            print(f"(exit {code})\n")
            if code == 0:
                held[name] = out.splitlines()[0].split(": ", 1)[1]

        print("$ git lease status")
        print(_lease(agents["agent-3"], "status")[1] + "\n")
        if "agent-1" in held:
            print(f"$ git lease renew {held['agent-1']}    # in agent-1")
            print(_lease(agents["agent-1"], "renew", held["agent-1"])[1] + "\n")
        for name, lease in held.items():
            print(f"$ git lease release {lease}    # in {name}")
            print(_lease(agents[name], "release", lease)[1])
        print("\n$ git lease acquire --agent agent-2 --task job_2 --scope services    # in agent-2, again")
        code, out = _lease(agents["agent-2"], "acquire", "--agent", "agent-2", "--task", "job_2", "--scope", "services")
        print(out + f"\n(exit {code})")
        if code == 0:
            again = out.splitlines()[0].split(": ", 1)[1]
            print(f"\n$ git lease release {again}    # in agent-2")
            print(_lease(agents["agent-2"], "release", again)[1])
        _pipeline(base, agents)
        left = [
            line
            for line in _git(remote, "for-each-ref", "refs/leases/").splitlines()
            if "refs/leases/outcome/" not in line  # the queue's outcomes stay: they are its record
        ]
        print("\nlease refs left on the remote:", "\n".join(left) or "none")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


# The fake agent of the pipeline: edits exactly its task's files (and, for a task with "stray", one more file
# outside its scope, committed past the hooks), a short while of "work", one commit.
AGENT = """
import json, os, subprocess, sys, time
task = json.load(sys.stdin)
time.sleep(task.get("work", 0.5))
for p in task["paths"] + ([task["stray"]] if task.get("stray") else []):
    with open(p, "a") as fh:
        fh.write("# " + task["prompt"] + "\\n")
subprocess.run(["git", "add", "-A"], check=True)
subprocess.run(["git", "-c", "user.name=" + os.environ["GITLEASE_TASK"], "-c", "user.email=agent@example.invalid",
                "commit", "-q", "--no-verify", "-m", task["prompt"]], check=True)
"""


def _pipeline(base: str, agents: dict[str, str]) -> None:
    """``git lease work``: six queued tasks, three workers, a lease held elsewhere, a stray edit."""
    print("\n--- the pipeline: git lease work ---\n")
    where = agents["agent-1"]
    extra = {
        "docs/billing.md": "billing docs",
        "docs/tax.md": "tax docs",
        "services/billing/invoice.py": "x",
        ".gitignore": "__pycache__/",
    }
    for path, text in extra.items():
        os.makedirs(os.path.join(where, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(where, path), "w") as fh:
            fh.write(text + "\n" if path == ".gitignore" else f"# {text}\n")
    _git(where, "add", ".")
    _git(where, "-c", "user.name=demo", "-c", "user.email=demo@example.invalid", "commit", "-q", "-m", "docs")
    _git(where, "push", "-q", "origin", "HEAD:main")
    tasks = [
        {"id": "bill-1", "paths": ["services/billing/api.py"], "prompt": "add refunds"},
        {"id": "tax-1", "paths": ["services/tax/rates.py"], "prompt": "2027 rates"},
        {"id": "calc-1", "paths": ["libs/tax/calc.py"], "prompt": "round half even"},  # libs/tax is leased
        {"id": "docs-1", "paths": ["docs/billing.md"], "prompt": "document refunds"},
        {
            "id": "bill-2",
            "paths": ["services/billing/invoice.py"],
            "prompt": "invoice numbers",
            "stray": "services/tax/notes.py",
        },  # also edits a file outside its scope: refused at landing
        {"id": "docs-2", "paths": ["docs/tax.md"], "prompt": "document rates"},
    ]
    queue = os.path.join(base, "queue.jsonl")
    with open(queue, "w") as fh:
        fh.write("".join(json.dumps(t) + "\n" for t in tasks))
    agent = os.path.join(base, "agent.py")
    with open(agent, "w") as fh:
        fh.write(AGENT)
    print(f"$ cat queue.jsonl\n{open(queue).read()}")
    print(
        "# bill-2's agent also edits services/tax/notes.py, outside its task's scope: the landing refuses that\n"
        "# edit, so bill-2 fails on purpose (the one failure below) and its work is kept in a quarantine ref\n"
    )
    code, out = _lease(agents["agent-3"], "acquire", "--agent", "agent-3", "--task", "hotfix", "--scope", "libs/tax")
    held = out.splitlines()[0].split(": ", 1)[1] if code == 0 else None
    print("$ git lease acquire --scope libs/tax    # in agent-3: calc-1 must wait for it")
    print(out.splitlines()[0] + "\n" if held else out + "\n")
    released: list[str] = []
    if held:
        print(f"# agent-3 releases {held} 3 s into the run (git lease release {held})\n")
        threading.Timer(3.0, lambda: released.append(_lease(agents["agent-3"], "release", held)[1])).start()
    cmd = [
        "work",
        queue,
        "--workers",
        "3",
        "--land",
        "main",
        "--verify",
        "python -m py_compile services/*/*.py",
        "--backoff",
        "1s",
        "--",
        sys.executable,
        agent,
    ]
    print("$ git lease work queue.jsonl --workers 3 --land main --verify 'python -m py_compile ...' -- ./agent.py")
    start = time.monotonic()
    code, out = _lease(where, *cmd)
    took = time.monotonic() - start
    print(out + f"\n(exit {code}: bill-2 failed, as intended: its edit outside its scope was refused; {took:.1f}s)")
    for line in released:
        print(f"(agent-3, 3 s into the run: {line}; calc-1 ran after it)")
    print()
    print("$ git lease work --status queue.jsonl")
    print(_lease(where, "work", "--status", queue)[1] + "\n")
    print("$ git log --oneline main    # on the remote")
    print(_git(where, "log", "--oneline", "--format=%h %an: %s", "origin/main").strip())


if __name__ == "__main__":
    sys.exit(main())
