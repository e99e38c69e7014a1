"""``git lease run`` (a command under a lease, stopped when the lease is lost) and ``git lease push`` (a push
fenced by the lease: the branch and the renewal in one atomic push)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from gitlease.cli.common import run, seconds, service, ttl_seconds
from gitlease.cli.options import JsonOpt, RemoteOpt, make_app
from gitlease.core import errors

app = make_app()

LeaseOpt = Annotated[
    str | None,
    typer.Option(
        "--lease", help="A lease this worktree already holds (default for push: $GITLEASE_LEASE, or the only one held)."
    ),
]


def _seconds(name: str, value: str | None, lo: int = 1) -> int | None:
    return None if value is None else seconds(name, value, lo)


def _log(line: str) -> None:
    sys.stderr.write(f"git-lease: {line}\n")
    sys.stderr.flush()


CommandArg = Annotated[list[str], typer.Argument(help="The command and its arguments (after --).")]
ScopesOpt = Annotated[list[str] | None, typer.Option("--scope", "-s", help="A path prefix to lease; repeat for more.")]
TtlOpt = Annotated[str | None, typer.Option(help="Time to live (default: lease.ttl, 300).")]
RenewEveryOpt = Annotated[str | None, typer.Option(help="Renew this often (default: a third of the TTL).")]
GraceOpt = Annotated[
    str | None,
    typer.Option(help="From SIGTERM to SIGKILL when the lease is lost (default: a tenth of the TTL, at most 10s)."),
]
WaitOpt = Annotated[str | None, typer.Option(help="Wait this long for the scope to be free (10m).")]
TaskOpt = Annotated[str | None, typer.Option(help="Task id (default: $GITLEASE_TASK).")]
AgentOpt = Annotated[str | None, typer.Option(help="Agent id (default: $GITLEASE_AGENT).")]
WorktreeFlag = Annotated[
    bool,
    typer.Option(
        "--worktree",
        help="Lease, attach a clean worktree bound to the lease (docs/worktrees.md), and run COMMAND inside it.",
    ),
]
BaseOpt = Annotated[str | None, typer.Option(help="With --worktree: start the task branch here.")]
RenewAgentOpt = Annotated[
    bool | None,
    typer.Option(
        "--renew-agent/--no-renew-agent",
        help="Renew through the per-host renewal agent, started on demand (default: git config lease.renewAgent, "
        "true); it falls back to renewing by itself if the agent dies.",
    ),
]
BranchOpt = Annotated[str | None, typer.Option(help="With --worktree: the task branch name.")]


@app.command("run", context_settings={"allow_interspersed_args": False})
def run_(
    command: CommandArg,
    scope: ScopesOpt = None,
    ttl: TtlOpt = None,
    renew_every: RenewEveryOpt = None,
    grace: GraceOpt = None,
    lease: LeaseOpt = None,
    wait: WaitOpt = None,
    task: TaskOpt = None,
    agent: AgentOpt = None,
    remote: RemoteOpt = None,
    worktree: WorktreeFlag = False,
    base: BaseOpt = None,
    renew_agent: RenewAgentOpt = None,
    branch: BranchOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run COMMAND under a lease: acquire (or --lease), renew in the background, and if the lease is lost stop
    the command's whole process group (SIGTERM, grace, SIGKILL) before the lease can expire. Exit with the
    command's code, or 6 when the lease was lost. The lease is released after the command stopped (a --lease
    given is kept)."""
    from gitlease.liveness.holding import HoldOptions

    outcome: dict[str, int] = {}

    def body():
        _check_run_flags(scope, lease, worktree, base, branch)
        options = HoldOptions(
            ttl=ttl_seconds(ttl),
            renew_every=_seconds("--renew-every", renew_every),
            grace=_seconds("--grace", grace, 0),
            wait=_seconds("--wait", wait, 0) if wait is not None else None,
            renew_agent=renew_agent,
            release=not lease,
        )
        opened = lambda path=".": service(remote, task=task, agent=agent, at=path)  # noqa: E731
        holding = _holding(opened, scope, lease, options, worktree=worktree, base=base, branch=branch)
        return _supervise(holding, command, outcome)

    try:
        run("run", as_json, body)
    except SystemExit as exc:
        if exc.code == 0 and "code" in outcome:
            raise SystemExit(outcome["code"]) from None
        raise


def _holding(opened, scope, lease, options, *, worktree: bool, base, branch):
    """The Holding ``git lease run`` runs under: the --lease this worktree holds, or a new one (in a worktree of
    its own with --worktree). ``opened(path)``: the service of the worktree at ``path``."""
    from gitlease.liveness.holding import Holding

    svc = opened()
    if lease:
        return Holding.adopt(svc, lease, options, log=_log)
    manager = None
    if worktree:
        from gitlease.worktree.manager import WorktreeManager

        manager = WorktreeManager(svc)
    holding = Holding.acquire(
        svc, scope or [], options, worktree=manager, base=base, branch=branch, on_wait=_waiting, log=_log,
        reopen=opened,
    )  # fmt: skip
    rec = holding.record
    _log(f"lease acquired: {holding.lease_id} ({' '.join(rec.paths)}, ttl {rec.ttl}s)")
    return holding


def _supervise(holding, command: list[str], outcome: dict[str, int]):
    """COMMAND under ``holding`` (liveness/supervise.run_under): its result, or LeaseLost (exit 6)."""
    from gitlease.identity.signer import commit_signing_config, config_env
    from gitlease.liveness.interrupts import Interrupts
    from gitlease.liveness.supervise import run_under

    att = holding.attached
    if att is not None:
        _log(f"worktree: {att.path} (branch {att.branch}); the command runs there")
    # the command's commits are signed with the lease's key (a claim to the lease is honoured only then)
    cmd_env = config_env(commit_signing_config(holding.svc.settings.signing_key), dict(os.environ))
    try:
        with Interrupts() as interrupts:
            res = run_under(
                holding, command, interrupts=interrupts, env=cmd_env, cwd=att.path if att else None, log=_log
            )
    except BaseException:
        holding.close()  # interrupted before the command ran: the lease is given back (a --lease kept)
        raise
    lease_id = holding.lease_id
    outcome["code"] = res.returncode
    result = {
        "leaseId": lease_id,
        "returncode": res.returncode,
        "lost": res.lost,
        "reason": res.reason,
        "released": res.released,
        "releaseError": res.release_error,
    }
    if res.lost:
        raise errors.LeaseLost(
            f"{errors.LeaseLost.say(lease_id, res.reason or 'no renewal confirmed')}; the command was "
            f"stopped (its exit status: {res.returncode})",
            **result,
        )
    if res.release_error:
        _log(f"warning: the lease was not released ({res.release_error}); it expires on its own")
    elif res.released:
        _log(f"lease released: {lease_id}")
    return result, []


def _check_run_flags(scope, lease, worktree: bool, base, branch) -> None:
    if lease and scope:
        raise errors.UsageError("give --scope (acquire a new lease) or --lease (use a held one), not both")
    if not lease and not scope:
        raise errors.UsageError("git lease run needs --scope PATH (or --lease ID) before -- COMMAND")
    if (base or branch) and not worktree:
        raise errors.UsageError("--base and --branch need --worktree")
    if worktree and lease:
        raise errors.UsageError(
            "--worktree acquires a new lease: give --scope, not --lease (or use "
            "git lease worktree add LEASE, then run --lease in that worktree)"
        )


def _waiting(refusal, pause: float) -> None:
    _log(f"waiting: {refusal.message}; next try in {pause:.1f}s")


def _lease_for_push(svc, given: str | None) -> str:
    if given:
        return given
    env = os.environ.get("GITLEASE_LEASE")
    if env:
        return env
    held = [h for h in svc.held_here().values() if h.store == svc.store.name]
    if len(held) == 1:
        return held[0].lease_id
    if not held:
        raise errors.NotHeld("this worktree holds no lease on the lease store; acquire one first")
    raise errors.UsageError("this worktree holds several leases: name one with --lease ID")


@app.command()
def push(
    push_remote: Annotated[
        str | None, typer.Argument(metavar="[REMOTE]", help="Where to push (default: the branch's push remote).")
    ] = None,
    refspecs: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[REFSPEC]...",
            help="Branches to push, as git push takes them: BRANCH, refs/heads/BRANCH, SRC:DST, HEAD:main "
            "(default: the current branch). Never '+', no deletes.",
        ),
    ] = None,
    lease: LeaseOpt = None,
    ttl: Annotated[str | None, typer.Option(help="New time to live (default: the lease's own).")] = None,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Push branches and renew the lease in ONE atomic push: if the lease was taken over, nothing lands (exit
    6). Every commit the push would land is checked first, as the pre-push hook does: a path outside the lease,
    or inside another live lease, refuses the push (exit 4) and nothing is pushed. Needs the lease store to be
    the remote pushed to."""

    def body():
        from gitlease.enforce.push import fenced_push, push_defaults

        svc = service(remote)
        target, specs = push_defaults(svc.repo.cwd, push_remote, refspecs)
        lease_id = _lease_for_push(svc, lease)
        try:
            got = fenced_push(svc, target, specs, lease_id, ttl=ttl_seconds(ttl))
        except errors.GitLeaseError as exc:
            if not as_json:
                for line in exc.details.get("lines") or []:
                    _say(line)
                for line in exc.details.get("server") or []:
                    _say(f"remote: {line}")
            raise
        if not as_json:
            for line in got.warnings:
                _say(line)
        branches = ", ".join(t.dst.removeprefix("refs/heads/") for t in got.targets)
        return (
            got.to_json(),
            [
                f"pushed {branches} to {target}, fenced by {lease_id} "
                f"({got.commits} commit{'s' if got.commits != 1 else ''}, {len(got.paths)} "
                f"path{'s' if len(got.paths) != 1 else ''} checked, lease.enforce={got.mode})",
                f"lease renewed: version={got.version} expiresAt={got.expires_at}",
            ],
        )

    run("push", as_json, body)


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
