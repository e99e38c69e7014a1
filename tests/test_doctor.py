"""``git lease doctor`` against real remotes: file://, git daemon, smart HTTP, and remotes that cannot host
leases (custom refs refused by a pre-receive hook, atomic not advertised, deletes denied)."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import cli, git, write_hook

from gitlease.core.clock import FakeClock
from gitlease.core.config import resolve
from gitlease.core.repo import Repo
from gitlease.ops import doctor as doc

REMOTE_PROBES = (
    "custom-refs",
    "atomic-advertised",
    "dir-file",
    "atomic-honoured",
    "compare-and-swap",
    "latency",
    "deletes",
    "cleanup",
)


def doctor_refs(bare) -> str:
    """The probe refs left (the verdict, refs/leases/verdict/, is kept on purpose: tests/test_verdict.py)."""
    return git(bare, "for-each-ref", "refs/leases/doctor/")


def run_doctor(cwd, url, *extra):
    """doctor --json, with a few rounds of the concurrency probe (tests/test_race_probe.py runs it in full)."""
    res = cli(cwd, "doctor", "--json", "--remote", url, "--rounds", "3", *extra)
    doc_ = json.loads(res.stdout)
    checks = doc_["result"]["checks"] if doc_["ok"] else doc_["error"]["details"]["checks"]
    return res, doc_, {c["name"]: c for c in checks}


def make_doctor(path, url=None, clock=None, **flags):
    repo = Repo.discover(path)
    settings = resolve(repo.config, env={}, remote=url, timeout=20, **flags)
    return doc.Doctor(repo, settings, clock=clock or doc.SYSTEM)


def test_doctor_passes_on_every_transport(remote, make_repo):
    work = make_repo()
    res, env, checks = run_doctor(work, remote.url)
    assert res.returncode == 0, res.stderr
    assert env["ok"] and env["result"]["ok"]
    for name in REMOTE_PROBES:
        assert checks[name]["status"] == "pass", checks[name]
    assert "atomic" in checks["atomic-advertised"]["capabilities"]
    assert checks["compare-and-swap"]["message"].startswith("the server refused")  # the server, not the client
    assert checks["clock"]["status"] == ("pass" if remote.kind == "http" else "skip")
    assert checks["hooks"]["status"] == "warn" and "not installed" in checks["hooks"]["message"]
    assert doctor_refs(remote.path) == ""


def test_human_output_is_one_line_per_check_for_the_configured_remote(remote_file, make_repo):
    work = make_repo()
    git(work, "remote", "add", "leases", remote_file.url)
    git(work, "config", "lease.remote", "leases")  # a remote name, from the configuration
    res = cli(work, "doctor")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "gitlease doctor: leases"
    assert any(ln.startswith("pass  custom-refs ") for ln in lines)
    assert all(ln.split()[0] in ("pass", "warn", "skip") for ln in lines[1:-1])
    assert lines[-1].startswith("ok: leases can host leases")
    assert doctor_refs(remote_file.path) == ""


def failed_doctor_behind(remote, cwd, hook: str):
    """doctor from ``cwd`` against ``remote`` once its pre-receive hook is ``hook``: it fails (exit 1)."""
    write_hook(remote.path, hook)
    res, env, checks = run_doctor(cwd, remote.url)
    assert res.returncode == 1
    return res, env, checks


def test_local_store(make_repo):
    work = make_repo()
    res = cli(work, "doctor", "--json")
    assert res.returncode == 0, res.stderr
    checks = {c["name"]: c for c in json.loads(res.stdout)["result"]["checks"]}
    for name in ("custom-refs", "dir-file", "atomic-honoured", "compare-and-swap", "deletes", "cleanup"):
        assert checks[name]["status"] == "pass", checks[name]
    assert git(work, "for-each-ref", "refs/leases/") == ""


def test_remote_refusing_custom_refs_fails(remote_file, make_repo):
    remote = remote_file  # (a server-side hook: the same on every transport)
    res, env, checks = failed_doctor_behind(
        remote,
        make_repo(),
        '#!/bin/sh\nwhile read old new ref; do case "$ref" in refs/leases/*)\n'
        '  echo "refs/leases/ is not allowed here" >&2; exit 1;; esac; done\n',
    )
    assert env["error"]["kind"] == "doctor-failed" and "custom-refs" in env["error"]["message"]
    assert checks["custom-refs"]["status"] == "fail"
    assert "refused" in checks["custom-refs"]["message"]
    assert checks["compare-and-swap"]["status"] == "skip"
    assert "cannot safely host leases" in res.stderr
    assert doctor_refs(remote.path) == ""


def test_remote_without_atomic_fails(remote, make_repo):
    git(remote.path, "config", "receive.advertiseAtomic", "false")
    res, env, checks = run_doctor(make_repo(), remote.url)
    assert res.returncode == 1
    assert checks["atomic-advertised"]["status"] == "fail"
    assert "does not advertise 'atomic'" in checks["atomic-advertised"]["message"]
    assert "atomic" not in checks["atomic-advertised"]["capabilities"]
    assert checks["atomic-honoured"]["status"] == "skip"
    # the other probes still ran, without --atomic, and cleaned up
    assert checks["compare-and-swap"]["status"] == "pass"
    assert checks["deletes"]["status"] == "pass"
    assert doctor_refs(remote.path) == ""


def test_remote_denying_deletes_fails_and_says_what_is_left(remote_file, make_repo):
    res, env, checks = failed_doctor_behind(  # (receive.denyDeletes covers refs/heads/ only)
        remote_file,
        make_repo(),
        '#!/bin/sh\nwhile read old new ref; do [ "$new" = 0000000000000000000000000000000000000000 ]'
        ' && { echo "no deletes" >&2; exit 1; }; done; exit 0\n',
    )
    assert checks["deletes"]["status"] == "fail" and "could not be released" in checks["deletes"]["message"]
    left = checks["cleanup"]["left"]
    assert checks["cleanup"]["status"] == "fail" and left
    assert all(ref.startswith("refs/leases/doctor/") for ref in left)
    assert sorted(doctor_refs(remote_file.path).split()[2::3]) == sorted(left)


def test_leftovers_of_a_killed_run_are_removed_and_a_live_run_is_not(remote_file, make_repo):
    work = make_repo()
    head = git(work, "rev-parse", "HEAD").strip()
    old = "refs/leases/doctor/20000101T000000Z-dead/probe"
    live = f"refs/leases/doctor/{doc.run_name(time.time(), 'beef')}/probe"
    git(work, "push", "-q", remote_file.url, f"{head}:{old}", f"{head}:{live}")
    res, env, checks = run_doctor(work, remote_file.url)
    assert res.returncode == 0, res.stderr
    assert "removed 1 left by an interrupted earlier run" in checks["cleanup"]["message"]
    assert doctor_refs(remote_file.path).split()[2::3] == [live]


def test_interrupt_during_the_probes_still_cleans_up(remote_daemon, make_repo):
    d = make_doctor(make_repo(), remote_daemon.url)
    seen = []

    def on_check(check):
        seen.append(check.name)
        if check.name == "dir-file":
            assert doctor_refs(remote_daemon.path) != ""  # probe refs exist right now
            raise KeyboardInterrupt

    d.on_check = on_check
    with pytest.raises(KeyboardInterrupt):
        d.diagnose()
    assert "dir-file" in seen
    assert doctor_refs(remote_daemon.path) == ""


def test_unreachable_remote_fails_closed(make_repo, tmp_path):
    res, env, checks = run_doctor(make_repo(), (tmp_path / "nowhere.git").as_uri())
    assert res.returncode == 1
    assert checks["custom-refs"]["status"] == "fail" and "cannot push" in checks["custom-refs"]["message"]
    assert checks["dir-file"]["status"] == "skip"


def test_trust_file_on_the_default_branch(remote_file, make_repo):
    work = make_repo()
    d = make_doctor(work, remote_file.url)
    d.check_trust_file()
    assert d.checks[-1].status == "warn" and "no default branch" in d.checks[-1].message
    git(work, "push", "-q", remote_file.url, "HEAD:refs/heads/main")
    d.check_trust_file()
    assert d.checks[-1].status == "warn" and "no trust file .gitlease/allowed_signers" in d.checks[-1].message
    (work / ".gitlease").mkdir()
    (work / ".gitlease" / "allowed_signers").write_text(
        '# agents\nagent-1 namespaces="gitlease" ssh-ed25519 AAAA\nagent-2 namespaces="gitlease" ssh-ed25519 BBBB\n'
    )
    git(work, "add", ".gitlease")
    git(work, "commit", "-q", "-m", "trust")
    git(work, "push", "-q", remote_file.url, "HEAD:refs/heads/main")
    git(work, "reset", "-q", "--hard", "HEAD~1")  # the commit is only on the remote's branch
    d.check_trust_file()
    assert d.checks[-1].status == "pass" and d.checks[-1].data["signers"] == 2
    assert "found on the remote's default branch (main)" in d.checks[-1].message


def test_hooks_installed_and_reachable_from_linked_worktrees(make_repo, tmp_path):
    work = make_repo()
    git(work, "worktree", "add", "-q", "--detach", str(tmp_path / "linked"))
    d = make_doctor(work)
    d.check_hooks()
    assert d.checks[-1].status == "warn" and "not installed" in d.checks[-1].message
    hooks = work / ".git" / "hooks"
    for name in ("pre-commit", "pre-push"):
        (hooks / name).write_text("#!/bin/sh\n# installed by gitlease\nexec git lease hook pre-commit\n")
        (hooks / name).chmod(0o755)
    d.check_hooks()
    assert d.checks[-1].status == "pass" and "2 worktrees" in d.checks[-1].message
    # A relative core.hooksPath resolves per worktree: the linked one no longer finds the hooks.
    (work / "myhooks").mkdir()
    for name in ("pre-commit", "pre-push"):
        os.link(hooks / name, work / "myhooks" / name)
    git(work, "config", "core.hooksPath", "myhooks")
    d.check_hooks()
    assert d.checks[-1].status == "warn" and "missing in 1 of 2 worktrees" in d.checks[-1].message
    # A hook that is not gitlease's (another manager's) does not count.
    (work / "myhooks" / "pre-push").unlink()
    (work / "myhooks" / "pre-push").write_text("#!/bin/sh\nexit 0\n")
    d.check_hooks()
    assert d.checks[-1].status == "warn"


def test_signing_key_checks(make_repo, tmp_path):
    work = make_repo()
    key = tmp_path / "id_ed25519"
    cases = [(None, "skip"), (str(tmp_path / "missing"), "fail")]
    for value, expected in cases:
        d = make_doctor(work, signing_key=value)
        d.check_signing_key()
        assert d.checks[-1].status == expected, d.checks[-1]
    key.write_text("not a real key\n")
    key.chmod(0o644)
    d = make_doctor(work, signing_key=str(key))
    d.check_signing_key()
    assert d.checks[-1].status == "warn" and "chmod 600" in d.checks[-1].message
    key.chmod(0o600)
    d.check_signing_key()
    assert d.checks[-1].status == "pass"


def test_clock_offset_from_the_http_date_header(remote_http, make_repo):
    work = make_repo()
    ahead = FakeClock(start=time.time() + 120)  # our clock two minutes ahead of the server's
    d = make_doctor(work, remote_http.url, clock=ahead)
    d.url = remote_http.url
    d._tmp = str(work / ".git")
    d.check_clock()
    c = d.checks[-1]
    assert c.status == "warn" and -122 < c.data["offsetSeconds"] < -118, c


def test_git_version_parsing_and_minimum():
    assert doc.parse_git_version("git version 2.39.5") == (2, 39, 5)
    assert doc.parse_git_version("git version 2.39.5.windows.1") == (2, 39, 5)
    assert doc.parse_git_version("git version 2.30.1 (Apple Git-130)") == (2, 30, 1)
    assert doc.parse_git_version("nonsense") is None
    assert doc.parse_git_version("git version 2.36.0")[:2] >= doc.MIN_GIT
    assert doc.parse_git_version("git version 2.35.9")[:2] < doc.MIN_GIT


def test_capabilities_from_packet_traces():
    file_trace = (
        "16:10:36.673751 pkt-line.c:80           packet: receive-pack> 0000000000000000000000000000000000000000"
        " capabilities^{}\\0report-status delete-refs atomic agent=git/2.39.5\n"
        "16:10:36.673818 pkt-line.c:80           packet:         push< 0000000000000000000000000000000000000000"
        " capabilities^{}\\0report-status delete-refs atomic ofs-delta agent=git/2.39.5\n"
        "16:10:36.673921 pkt-line.c:80           packet:         push> 0000000000000000000000000000000000000000"
        " 204cbe1c7952d0e61d30e5c027a140c70713f021 refs/leases/doctor/a\\0 report-status-v2 quiet\n"
    )
    assert doc.advertised_capabilities(file_trace) == [
        "report-status",
        "delete-refs",
        "atomic",
        "ofs-delta",
        "agent=git/2.39.5",
    ]
    http_trace = (
        "16:10:44.0 pkt-line.c:80 packet:          git< 00bf0000000000000000000000000000000000000000 "
        "204cbe1c7952d0e61d30e5c027a140c70713f021 refs/x\\0 report-status-v2\n"
        "16:10:44.1 pkt-line.c:80 packet:          git< 204cbe1c7952d0e61d30e5c027a140c70713f021 "
        "refs/leases/doctor/a\\0report-status quiet ofs-delta\n"
    )
    assert doc.advertised_capabilities(http_trace) == ["report-status", "quiet", "ofs-delta"]
    assert doc.advertised_capabilities("fatal: unable to access\n") is None


def test_offset_from_a_date_header():
    trace = "16:11:56.372408 http.c:684              <= Recv header: Date: Wed, 02 Dec 2026 16:11:56 GMT\n"
    server = 1796227916.0  # 2026-12-02T16:11:56Z
    offset, error = doc.http_date_offset(trace, server + 10.0, server + 10.2)
    assert offset == pytest.approx(-9.6) and error == pytest.approx(0.6)
    assert doc.http_date_offset("no headers here", 0, 1) is None


def test_run_names_round_trip():
    name = doc.run_name(1796227916.7, "abcd")
    assert name == "20261202T161156Z-abcd" and doc.run_started(name) == 1796227916.0
    assert doc.run_started("not-a-run") is None


def test_probe_refs_do_not_block_acquires(make_repo):
    work = make_repo()
    git(work, "update-ref", f"{doc.DOCTOR_PREFIX}{doc.run_name(time.time(), 'cafe')}/probe", "HEAD")
    res = cli(work, "can-start", "--scope", "services")
    assert res.returncode == 0, res.stderr


def test_sigterm_during_a_probe_cleans_up_and_exits_130(remote_file, make_repo, tmp_path):
    import signal
    import subprocess
    import sys

    fifo = tmp_path / "hook-running"
    os.mkfifo(fifo)
    write_hook(  # holds the directory/file probe until we signal
        remote_file.path,
        f'#!/bin/sh\nwhile read old new ref; do case "$ref" in */df/sub) echo go > "{fifo}";'
        " exec sleep 60;; esac; done; exit 0\n",
    )
    exe = os.path.join(os.path.dirname(sys.executable), "git-lease")  # itself, not git's wrapper (which dies of
    proc = subprocess.Popen(
        [exe, "doctor", "--json", "--remote", remote_file.url],
        cwd=make_repo(),  # SIGTERM)
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with open(fifo) as fh:  # returns once the hook runs: the probe refs exist now
            assert fh.read().strip() == "go"
        assert doctor_refs(remote_file.path) != ""
        os.kill(proc.pid, signal.SIGTERM)
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert json.loads(out)["error"]["kind"] == "interrupted"
    assert doctor_refs(remote_file.path) == ""


def test_a_remote_that_forbids_rewinds_and_deletes_fails_deletes_only(remote_file, make_repo):
    """Like gitolite's RW without +: creates and fast-forwards only. Lease refs are created, fast-forwarded
    (renewals) and deleted, so deletes fail, with the server's reason; the compare-and-swap probe (fast-forwards
    only) passes: the server's check is not what is wrong there."""
    res, env, checks = failed_doctor_behind(
        remote_file,
        make_repo(),
        "#!/bin/sh\nz=0000000000000000000000000000000000000000\nwhile read old new ref; do\n"
        '  [ "$new" = $z ] && { echo "DENIED: delete $ref" >&2; exit 1; }\n'
        '  [ "$old" != $z ] && ! git merge-base --is-ancestor "$old" "$new" && { echo "DENIED: rewind" >&2; exit 1; }\n'
        "done\nexit 0\n",
    )
    assert checks["compare-and-swap"]["status"] == "pass", checks["compare-and-swap"]
    assert checks["deletes"]["status"] == "fail" and "DENIED: delete" in checks["deletes"]["message"]
    assert [c["name"] for c in checks.values() if c["status"] == "fail"] == ["deletes", "cleanup"]
