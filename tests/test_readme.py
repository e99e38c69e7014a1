"""The README's "three agents in five minutes" and its Python example, run as written: a new user pastes them,
so they must work, with the signing set-up they describe, up to the CI check passing on agent-1's branch."""

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import git

README = Path(__file__).resolve().parent.parent / "README.md"


def _block(marker: str, lang: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"<!-- BEGIN {marker}")
    end = text.index(f"<!-- END {marker} -->")
    m = re.search(rf"```{lang}\n(.*?)```", text[start:end], re.S)
    assert m, f"no {lang} block between the {marker} markers"
    return m.group(1)


def _python_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## From Python") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_three_agents_in_five_minutes_runs_as_written_and_the_python_example_with_it(tmp_path):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    script = _block("three-agents", "sh")
    res = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert len(re.findall(r"^lease acquired: lease_\w+$", out, re.M)) == 1, out  # agent-1's went into $lease
    assert "refused with exit 3" in out and "agent-1" in res.stderr
    assert re.search(r"^signed: trust from \.gitlease/signers/ \(1 file\) on main", out, re.M), out
    assert "INVALID" not in out and "[unsigned]" not in out
    released = re.search(r"^lease released: (lease_\w+)$", out, re.M)
    assert released and "Traceback" not in res.stderr
    # the fenced push landed agent-1's branch; the host's key is one file, one line for the three agents, in a
    # commit of its own on main
    remote = tmp_path / "remote.git"
    assert git(remote, "rev-parse", "--verify", "-q", "refs/heads/billing").strip()
    files = git(remote, "ls-tree", "--name-only", "main", ".gitlease/signers/").split()
    assert len(files) == 1 and not git(remote, "ls-tree", "main", ".gitlease/allowed_signers")
    trust = git(remote, "show", f"main:{files[0]}").splitlines()
    assert len(trust) == 1 and trust[0].startswith("agent-1,agent-2,agent-3 ")
    # the CI check passed on agent-1's branch for the right reason: its one commit names agent-1's lease in a
    # trailer and carries git's SSH signature by that lease's owner key (init set commit signing up)
    lease = released.group(1)
    assert f"verify ok: 1 path in 1 commit (origin/main..billing), lease {lease} (from trailer)" in out, out
    commit = git(remote, "cat-file", "commit", "billing")
    assert "-----BEGIN SSH SIGNATURE-----" in commit and f"Lease: {lease}" in commit
    host_key = trust[0].split()[-2:]
    allowed = tmp_path / "allowed"
    allowed.write_text(f"agent-1 {' '.join(host_key)}\n")
    check = subprocess.run(
        ["git", "-c", f"gpg.ssh.allowedSignersFile={allowed}", "verify-commit", "billing"],
        cwd=remote,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0 and 'Good "git" signature for agent-1' in check.stderr, check.stderr

    code = _python_block()
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path / "agent-1", capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
    status = subprocess.run(
        ["git", "lease", "status", "--json"], cwd=tmp_path / "agent-1", capture_output=True, text=True, env=env
    )
    assert '"agent-1"' not in status.stdout  # everything the example took, it gave back
