"""The README's "three agents in five minutes" and its Python example, run as written (issue 21): a new user
pastes them, so they must work, with the signing set-up they describe."""

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
    assert len(re.findall(r"^lease acquired: lease_\w+$", out, re.M)) == 2, out
    assert "refused with exit 3" in out and "agent-1" in res.stderr
    assert re.search(r"^signed: trust from \.gitlease/allowed_signers on main", out, re.M), out
    assert "INVALID" not in out and "[unsigned]" not in out
    assert re.search(r"^lease released: lease_\w+$", out, re.M)
    assert "Traceback" not in res.stderr
    # the fenced push landed agent-1's branch; the trust file is one line for the three agents
    assert git(tmp_path / "remote.git", "rev-parse", "--verify", "-q", "refs/heads/billing").strip()
    trust = git(tmp_path / "remote.git", "show", "main:.gitlease/allowed_signers").splitlines()
    assert len(trust) == 1 and trust[0].startswith("agent-1,agent-2,agent-3 ")

    code = _python_block()
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path / "agent-1", capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
    status = subprocess.run(
        ["git", "lease", "status", "--json"], cwd=tmp_path / "agent-1", capture_output=True, text=True, env=env
    )
    assert '"agent-1"' not in status.stdout  # everything the example took, it gave back
