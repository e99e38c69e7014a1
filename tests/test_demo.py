"""`make demo`, the README's first command: three agents against a bare remote, one refused, nothing left."""

import re
import subprocess
import sys


def test_the_demo_runs_clean_whatever_the_default_branch(isolated_git, tmp_path):
    (isolated_git / ".gitconfig").write_text("[init]\n\tdefaultBranch = trunk\n")  # not the demo's 'main'
    res = subprocess.run([sys.executable, "-m", "gitlease.demo"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert len(re.findall(r"^lease acquired: lease_", out, re.M)) == 4  # three agents, then agent-3 again
    assert re.search(
        r"git-lease: scope services is held: lease_\w+ on libs/tax services/billing by task=job_1 "
        r"agent=agent-1 \(\d+s left\)\n\(exit 3\)",
        out,
    ), out
    assert "unsigned: no trust file (neither .gitlease/allowed_signers nor .gitlease/signers/*.pub on main" in out
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
    # the one failure is announced as intended, before and after the run
    assert "so bill-2 fails on purpose (the one failure below)" in out
    assert "(exit 1: bill-2 failed, as intended: its edit outside its scope was refused;" in out
    # every release is said: agent-2's second lease, and agent-3's lease that calc-1 waited for
    assert re.search(r"^\$ git lease release (lease_\w+)    # in agent-2\nlease released: \1$", out, re.M), out
    assert re.search(r"^\(agent-3, 3 s into the run: lease released: lease_\w+; calc-1 ran after it\)$", out, re.M), out


def test_a_retry_message_is_shortened_at_a_word_end():
    from gitlease.work.landing import shortened as _shortened

    text = "push rejected, nothing landed: refs/heads/main atomic transaction failed; " * 4
    short = _shortened(text)
    assert len(short) <= 164 and short.endswith(" ...") and text.startswith(short[:-4])
    assert text[len(short) - 4] == " " or short[:-4].endswith(("failed", "landed", "main", "transaction"))
    assert _shortened("x" * 300).endswith("x ...") and _shortened("short") == "short"
