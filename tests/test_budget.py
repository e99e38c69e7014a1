"""The push-budget arithmetic of ``git lease budget`` (pure functions) and its command line."""

import json

import pytest
from conftest import cli
from hypothesis import given
from hypothesis import strategies as st

from gitlease.core.errors import UsageError
from gitlease.ops.budget import Fleet, plan


def test_issue_anchor_twelve_agents_at_a_two_minute_heartbeat():
    # "One push per lease per 2-minute heartbeat spends that budget at about 12 agents."
    b = plan(Fleet(agents=12, hosts=1, ttl=240, renew_every=120, tasks_per_hour=0), 6)
    assert b.per_lease.renewals == pytest.approx(6.0) and b.per_lease.fits
    assert b.per_lease.max_agents == 12
    assert not plan(Fleet(agents=13, hosts=1, ttl=240, renew_every=120, tasks_per_hour=0), 6).per_lease.fits
    assert b.batched.renewals == pytest.approx(0.5) and b.batched.max_agents is None  # no tasks: no limit


def test_issue_11_benchmark_fleet_fits_only_batched():
    # 100 agents on 10 hosts, 30-minute tasks, TTL 10 minutes, renewal at half TTL.
    b = plan(Fleet(agents=100, hosts=10, ttl=600, tasks_per_hour=2), 6)
    assert b.fleet.interval == 300
    assert b.per_lease.acquire_release == pytest.approx(100 * 2 * 2 / 60)
    assert b.per_lease.renewals == pytest.approx(20.0) and not b.per_lease.fits
    assert b.batched.acquire_release == pytest.approx(100 * 2 / 60)
    assert b.batched.renewals == pytest.approx(2.0)
    assert b.batched.total == pytest.approx(16 / 3) and b.batched.fits
    assert b.batched.max_agents == 120


def test_more_hosts_than_agents_renew_only_for_the_agents():
    b = plan(Fleet(agents=2, hosts=5, ttl=300, tasks_per_hour=0), 6)
    assert b.batched.renewals == pytest.approx(2 * 60 / 150)


def test_hosts_whose_renewals_alone_exceed_the_limit_fit_no_agents():
    b = plan(Fleet(agents=1, hosts=20, ttl=300, tasks_per_hour=1), 6)  # 20 hosts * 0.4 = 8 > 6
    assert b.batched.max_agents == 0


@given(hosts=st.integers(1, 50), ttl=st.integers(10, 7200), tasks=st.floats(0.1, 60), limit=st.floats(0.5, 1000))
def test_the_largest_fleet_fits_and_one_more_does_not(hosts, ttl, tasks, limit):
    def model(agents, kind):
        return getattr(plan(Fleet(agents, hosts, ttl, None, tasks), limit), kind)

    n = model(0, "per_lease").max_agents
    assert model(n, "per_lease").fits and not model(n + 1, "per_lease").fits
    n = model(0, "batched").max_agents
    if n >= hosts:  # (the formula counts one renewal push for each of the H hosts)
        assert model(n, "batched").fits and not model(n + 1, "batched").fits
    for agents in (0, 1, hosts, 10 * hosts):
        assert model(agents, "batched").total <= model(agents, "per_lease").total + 1e-9


@pytest.mark.parametrize(
    "fleet, limit, message",
    [
        (Fleet(-1, 1, 300), 6, "--agents"),
        (Fleet(1, 0, 300), 6, "--hosts"),
        (Fleet(1, 1, 300, renew_every=300), 6, "shorter than the TTL"),
        (Fleet(1, 1, 300, tasks_per_hour=-1), 6, "--tasks-per-hour"),
        (Fleet(1, 1, 300), 0, "--limit"),
    ],
)
def test_bad_input_is_a_usage_error(fleet, limit, message):
    with pytest.raises(UsageError, match=message):
        plan(fleet, limit)


def test_cli(tmp_path):
    res = cli(tmp_path, "budget", "--agents", "10", "--ttl", "5m", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)["result"]
    assert out["fleet"]["renewEvery"] == 150 and out["limit"] == 6
    assert out["perLease"]["maxAgents"] == 12 and out["batched"]["maxAgents"] == 168
    res = cli(tmp_path, "budget", "--agents", "30")
    assert res.returncode == 0
    assert (
        "OVER the limit" in res.stdout
        and "per-lease renewals (each holder renews its own lease: lease.renewAgent false):" in res.stdout
    )
    res = cli(tmp_path, "budget", "--ttl", "60", "--renew-every", "90")
    assert res.returncode == 2 and "shorter than the TTL" in res.stderr
