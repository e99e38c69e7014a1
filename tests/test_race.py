"""Real processes racing at one barrier: exactly one winner on overlapping scopes, all win when disjoint."""

import multiprocessing as mp

import pytest

from gitlease.core import errors

ctx = mp.get_context("fork")
N = 8


def _worker(fleet, name, scope_paths, barrier, results):
    svc = fleet.agent(name)
    barrier.wait(timeout=60)
    try:
        got = svc.acquire(scope_paths)
        results.put((name, "won", got.lease_id))
    except errors.HeldError:
        results.put((name, "held", None))
    except Exception as exc:  # reported, so the test shows it
        results.put((name, "error", f"{type(exc).__name__}: {exc}"))


def race(fleet, scopes_for):
    names = [f"r{i}" for i in range(N)]
    for n in names:
        fleet.path(n)  # repositories/worktrees made before the race
    barrier, results = ctx.Barrier(N), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(fleet, n, scopes_for(i), barrier, results)) for i, n in enumerate(names)]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errs = [o for o in out if o[1] == "error"]
    assert not errs, (errs, _refs(fleet))
    return [o for o in out if o[1] == "won"]


def _state(fleet):
    """What the store holds, for the failure message."""
    snap = fleet.agent("inspector").snapshot(use_cache=False)
    return [(v.lease_id, v.paths, v.state(fleet.clock.now(), 30), v.problems) for v in snap.leases]


def _refs(fleet):
    """Every ref under the lease namespace, for the failure message."""
    return sorted(fleet.agent("inspector").store.list_refs().items())


def _clear(fleet):
    svc = fleet.agent("cleaner")
    from gitlease.core.store import RefUpdate

    refs = svc.store.list_refs()
    if refs:
        assert svc.store.apply([RefUpdate(r, None, o) for r, o in refs.items()]).ok


OVERLAPPING = [
    ["services/billing"],
    ["services"],
    ["services/billing/api.py"],
    ["."],
    ["services/billing"],
    ["services/billing", "libs"],
    ["services/billing"],
    ["services"],
]


@pytest.mark.parametrize("rounds", [3])
def test_overlapping_exactly_one_winner(fleet, rounds):
    for _ in range(rounds):
        winners = race(fleet, lambda i: OVERLAPPING[i])
        assert len(winners) == 1, (winners, _state(fleet), _refs(fleet))
        _clear(fleet)


def test_disjoint_all_win(fleet):
    winners = race(fleet, lambda i: [f"pkg{i}/src", f"shared/part{i}"])
    assert len(winners) == N


@pytest.mark.slow
def test_overlapping_many_rounds(fleet):
    for _ in range(40):
        winners = race(fleet, lambda i: ["same/path"])
        assert len(winners) == 1, winners
        _clear(fleet)
