"""``make demo``: a temporary repository with a bare remote, three agents with overlapping and disjoint
scopes, who got what and who was refused; then everything is cleaned up.

It drives the real ``git lease`` executable through real git, as an agent would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile


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
            _lease(agents["agent-2"], "release", out.splitlines()[0].split(": ", 1)[1])
        print("\nlease refs left on the remote:", _git(remote, "for-each-ref", "refs/leases/").strip() or "none")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
