"""No push gitlease makes may switch the compare-and-swap off: no --force, no '+' refspec, every ref pinned."""

import pytest

from gitlease.core import errors, gitcmd
from gitlease.core.store import RefUpdate, push_argv


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    real = gitcmd.run

    def spy(args, **kw):  # records the argv, then runs the real git
        calls.append(list(args))
        return real(args, **kw)

    monkeypatch.setattr(gitcmd, "run", spy)
    return calls


def _check(argv):
    assert argv[0] == "push" and "--atomic" in argv and "--porcelain" in argv
    assert not any(a in ("--force", "-f") or a.startswith("--force=") or a == "--mirror" for a in argv)
    specs = [a for a in argv[1:] if not a.startswith("-")]
    assert not any(s.startswith("+") for s in specs), specs
    pinned = {a.split("=", 1)[1].rsplit(":", 1)[0] for a in argv if a.startswith("--force-with-lease=")}
    targets = {s.rsplit(":", 1)[1] for s in specs[1:]}
    assert targets <= pinned, (targets, pinned)


def test_every_push_is_pinned(fleet, recorded):
    if fleet.url is None:
        pytest.skip("the local store does not push")
    a, b = fleet.agent("a"), fleet.agent("b")
    got = a.acquire(["x", "y/z"], ttl=30)
    a.renew(got.lease_id)
    with pytest.raises(errors.HeldError):
        b.acquire(["x/1"])
    fleet.clock.advance(100)
    b.acquire(["x/1"])  # clears the expired lease first
    with pytest.raises(errors.LeaseLost):
        a.release(got.lease_id)
    pushes = [c for c in recorded if c[0] == "push"]
    assert len(pushes) >= 5
    for argv in pushes:
        _check(argv)


def test_push_argv_refuses_forced_refspec():
    with pytest.raises(ValueError):
        push_argv("origin", [RefUpdate("refs/leases/id/x", "a" * 40, None)], extra_refspecs=["+main:main"])
    argv = push_argv("origin", [RefUpdate("refs/leases/id/x", None, "b" * 40)])
    assert f"--force-with-lease=refs/leases/id/x:{'b' * 40}" in argv and ":refs/leases/id/x" in argv
