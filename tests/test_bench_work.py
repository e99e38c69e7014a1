"""bench/work.py (issue 19's fleet benchmark) runs end to end on a short queue: every task of each trace lands
through the real runner, the table gets one row a configuration, and --write replaces only its own section of
the document. No figure is checked (tests never judge timings): that the bench measures what it says is."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_work", ROOT / "bench" / "work.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_work"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_fleet_bench_lands_every_task_and_writes_its_section(tmp_path, capsys):
    bench = _bench()
    doc = tmp_path / "performance.md"
    doc.write_text(f"# Performance\n\nbefore\n\n{bench.BEGIN}\nold table\n{bench.END}\n\nafter\n")
    assert bench.main(["--tasks", "3", "--workers", "1,2", "--granularity", "file", "--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Performance\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old table" not in text
    rows = [ln for ln in text.splitlines() if re.match(r"\| (requests|tokio) \| file \| [12] \|", ln)]
    assert len(rows) == 4  # two traces x two worker counts
    for row in rows:
        span, bound = (float(x) for x in re.findall(r"\| ([0-9.]+) s", row))
        assert span > 0 and bound > 0
    assert all(row.endswith("|") for row in rows) and capsys.readouterr().out.count("| file |") == 4


def test_the_fleet_bench_stops_when_a_task_does_not_land(tmp_path):
    """run_one refuses to report a makespan for a run in which a task failed (the agent exits 1)."""
    import pytest

    bench = _bench()
    agent = tmp_path / "agent.py"
    agent.write_text("import sys\nsys.exit(1)\n")
    tasks = bench.load(bench.TRACES["requests"], 1)
    with pytest.raises(SystemExit, match="failed"):
        bench.run_one(tasks, 1, "file", agent)
