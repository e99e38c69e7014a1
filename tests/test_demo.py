"""`make demo`, the README's first command: three agents against a bare remote, one refused, nothing left."""

import re
import subprocess
import sys


def test_the_demo_runs_clean_whatever_the_default_branch(isolated_git, tmp_path):
    (isolated_git / ".gitconfig").write_text("[init]\n\tdefaultBranch = trunk\n")  # not the demo's 'main'
    res = subprocess.run([sys.executable, "-m", "gitlease.demo"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert len(re.findall(r"^lease acquired: lease_", out, re.M)) == 3
    assert re.search(
        r"git-lease: scope services is held: lease_\w+ on libs/tax services/billing by task=job_1 "
        r"agent=agent-1 \(\d+s left\)\n\(exit 3\)",
        out,
    ), out
    assert "unsigned: no trust file (.gitlease/allowed_signers not on main" in out
    assert out.rstrip().endswith("lease refs left on the remote: none")
    assert "Traceback" not in out + res.stderr


def test_the_demo_shows_the_pipeline(tmp_path):
    """``git lease work`` in the demo: a task waits for a lease held elsewhere and runs later, a stray edit is
    refused at landing (its work kept), the summary."""
    res = subprocess.run([sys.executable, "-m", "gitlease.demo"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert re.search(r"^worker \d: waiting calc-1: scope held by lease_\w+$", out, re.M), out
    assert re.search(r"^worker \d: landed calc-1: commit=", out, re.M), out
    assert re.search(
        r"^worker \d: failed bill-2: push refused, nothing pushed: .*services/tax/notes\.py.*work kept in refs/",
        out,
        re.M,
    )
    assert re.search(
        r"^done 5, failed 1; makespan [\d.]+s; agents [\d.]+s, verify [\d.]+s, landing [\d.]+s; parallelism", out, re.M
    ), out
    assert re.search(r"^failed   bill-2  attempts=1  quarantine=refs/leases-quarantine/bill-2/1  ", out, re.M), out
