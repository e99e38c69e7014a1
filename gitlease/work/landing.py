"""Landing a verified task (``git lease work --land BRANCH``, docs/work.md): the task branch rebased onto the
fresh base, then ONE fenced, scope-checked atomic push (gitlease.enforce.push.fenced_push) of the branch, the
lease's renewal and the task's ``done`` outcome, so a task lands exactly once and only under its live lease.

A non-fast-forward (another task landed first) re-fetches, rebases and tries again, up to ``land_retries``
times. A path outside the lease (ScopeViolation) fails the task at once; a lost lease re-queues it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gitlease.core import gitcmd
from gitlease.core.errors import LeaseLost, PushRejected, ScopeViolation
from gitlease.core.refnames import outcome_ref

if TYPE_CHECKING:
    from gitlease.work.attempt import TaskAttempt
    from gitlease.work.runner import Runner


class Lander:
    def __init__(self, runner: Runner) -> None:
        self.r = runner

    def land(self, at: TaskAttempt, base_ref: str) -> str | None:
        """Land ``at``'s task branch; the commit landed, or None when it had nothing to land (its outcome is
        then ``done`` with "nothing to land"). Raises the attempt's _Fail otherwise."""
        started = self.r.clock.monotonic()
        try:
            return self._land(at, base_ref)
        finally:
            spent = self.r.clock.monotonic() - started
            with self.r._lock:
                at.st.land += spent

    def _land(self, at: TaskAttempt, base_ref: str) -> str | None:
        from gitlease.enforce.push import fenced_push
        from gitlease.work.attempt import _Fail

        r, task, path = self.r, at.task, at.att.path
        assert at.holding is not None
        wsvc = at.holding.svc
        target = r._target(task)
        parent = at.prev.oid if at.prev else None
        for i in range(r.opts.land_retries + 1):
            _branch_name, fresh = r._fetch_base()
            ahead = gitcmd.run(["rev-list", "--count", f"{fresh}..HEAD"], cwd=path).out.strip()
            if ahead == "0":
                if r._outcomes.write(task.id, "done", at.number, parent=parent, reason="nothing to land") is None:
                    raise _Fail("the task's outcome changed meanwhile (another runner)")
                return None
            reb = gitcmd.run(["rebase", "--quiet", fresh], cwd=path, check=False)
            if reb.returncode != 0:
                gitcmd.run(["rebase", "--abort"], cwd=path, check=False)
                raise _Fail(f"rebase onto {base_ref} failed: {(reb.err or reb.out).strip().splitlines()[-1:]}")
            head = gitcmd.run(["rev-parse", "HEAD"], cwd=path).out.strip()
            oid, _ = r._outcomes.make(task.id, "done", at.number, parent=parent, landed=head)
            try:
                fenced_push(wsvc, r.remote, [f"HEAD:{target}"], at.lease_id, also=[f"{oid}:{outcome_ref(task.id)}"])
                return head
            except ScopeViolation as exc:  # a lease lost meanwhile is LeaseLost (check_landing), not this
                raise _Fail(exc.message, final=True) from None
            except LeaseLost as exc:
                raise _Fail(exc.message) from None
            except PushRejected as exc:
                if i >= r.opts.land_retries:
                    raise _Fail(f"landing refused {i + 1} times: {exc.message}") from None
                with r._lock:
                    r.land_retries += 1
                    r.retries += 1
                at.emit("landing", message=f"not landed ({exc.message[:120]}); re-fetching, retrying")
        raise _Fail("landing retries exhausted")


__all__ = ["Lander"]
