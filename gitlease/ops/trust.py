"""``git lease trust add|remove|list``: who may sign leases, one file per signer on the store's default branch.

Readers trust the trust file and the signer files beside it (``.gitlease/allowed_signers`` and
``.gitlease/signers/<name>.pub``, identity/trust.py) as the lease store's default branch has them. ``add`` and
``remove`` change ONE signer's file in a commit made on top of that branch as the remote has it (never the
work tree, never the checked-out branch) and push it pinned to the commit it was made on
(``--force-with-lease``, never ``+``). When another host's change landed first the push is refused as stale:
the branch is read again and the commit made again on top of it. Hosts joining at the same time each write a
file of their own, so there is nothing to merge and nothing can conflict; each retry only waits for the
branch to stop moving.

A signer is usually a host (one key for its agents, ``git lease init --agents``): its file holds one
allowed_signers line per key, ``<agents> namespaces="gitlease" <key>``. Revoking a host is removing its file.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gitlease.core import gitq
from gitlease.core.config import Settings
from gitlease.core.errors import GitLeaseError, UsageError
from gitlease.core.fsutil import put_file
from gitlease.core.repo import Repo
from gitlease.core.store import RefUpdate, RemoteStore

if TYPE_CHECKING:
    from gitlease.identity.trust import Trust

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+=-]{0,99}$")
RETRY_ON = (
    "stale info",
    "fetch first",
    "non-fast-forward",
    "failed to update ref",
    "atomic transaction failed",
    "cannot lock ref",
    "incorrect old value",
)
ATTEMPTS = 30


def host_name() -> str:
    """This host's name as a signer name (what a file name can hold)."""
    name = re.sub(r"[^A-Za-z0-9._@+=-]", "_", os.uname().nodename or "host").lstrip("._-@+=")
    return name[:100] or "host"


def check_name(name: str) -> str:
    if not NAME.match(name) or name.endswith(".pub"):
        raise UsageError(
            f"signer name {name!r}: a file name of letters, digits and . _ @ + = - (a host or agent name, "
            "without .pub), at most 100 characters"
        )
    return name


def signer_line(principals: Sequence[str], key: str, *, admin: bool = False) -> str:
    """An allowed_signers line: ``<agents> namespaces="gitlease" <type> <base64>`` (``gitlease-admin`` too
    for an admin key)."""
    words = key.split()
    if len(words) < 2:
        raise UsageError(f"not a public key: {key[:40]!r}")
    spaces = "gitlease,gitlease-admin" if admin else "gitlease"
    return f'{",".join(principals)} namespaces="{spaces}" {words[0]} {words[1]}'


def with_line(old: bytes | None, line: str) -> bytes:
    """The file ``old`` with ``line`` in place of the line for the same key (or added at the end)."""
    key = " ".join(line.split()[-2:])
    kept = [ln for ln in (old or b"").decode("utf-8", "replace").splitlines() if ln.strip()]
    out = [line if " ".join(ln.split()[-2:]) == key else ln for ln in kept]
    if line not in out:
        out.append(line)
    return ("\n".join(out) + "\n").encode("utf-8")


@dataclass
class Change:
    """What ``add`` or ``remove`` did to one signer's file."""

    name: str
    path: str  # the signer file, in the repository
    action: str  # added | updated | removed | unchanged | written (to the work tree: commit it yourself)
    where: str  # the branch and store it is on, or the folder it was written in
    commit: str | None = None  # the default branch's commit that holds the change (after a push)
    attempts: int = 0  # pushes made (1 + those refused because another change landed first)
    text: str = ""  # the file's content afterwards
    next_steps: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": self.path,
            "action": self.action,
            "where": self.where,
            "commit": self.commit,
            "attempts": self.attempts,
            "text": self.text,
            "nextSteps": self.next_steps,
        }


Edit = Callable[[bytes | None], bytes | None]  # a file's content (None: absent) -> what it becomes


def change(
    repo: Repo,
    remote: str | None,
    trust_path: str,
    name: str,
    edit: Edit,
    *,
    verb: str = "trust",
    push: bool = True,
    timeout: float = 30.0,
    attempts: int = ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> Change:
    """Apply ``edit`` to signer ``name``'s file: on the store's default branch (a commit pushed with retries),
    or, without a remote store or with ``push=False``, in the work tree (for a commit through review)."""
    from gitlease.identity.trust import signer_file

    path = signer_file(trust_path, check_name(name))
    local = os.path.isabs(os.path.expanduser(trust_path))
    if local or remote is None or not push:
        return _write_here(repo, path, name, edit, local=local, remote=remote)
    message = f"gitlease: {verb} {name} ({path})"
    for tries in range(1, attempts + 1):
        store = RemoteStore(repo.cwd, remote, timeout=timeout)
        head = store.default_head()
        if head is None:
            raise GitLeaseError(
                f"{remote} has no default branch to hold the trust files: push one first "
                "(git push origin main), or set the remote's HEAD"
            )
        branch, base = head
        short = branch.removeprefix("refs/heads/")
        old = store.file_at(base, path)
        new = edit(old)
        where = f"{short} of {remote}"
        if new == old:
            text = (new or b"").decode("utf-8", "replace")
            return Change(name, path, "unchanged", where, base, tries - 1, text)
        commit = _commit_on(repo, base, path, new, message)
        out = store.apply([RefUpdate(branch, commit, base)])
        if out.ok:
            action = "removed" if new is None else ("added" if old is None else "updated")
            return Change(name, path, action, where, commit, tries, (new or b"").decode("utf-8", "replace"))
        if out.ambiguous:
            out.check_reached()  # never reached the remote: RemoteUnavailable; else read again and see
            continue
        reasons = [s.removeprefix("rejected:") for s in out.statuses.values() if s.startswith("rejected")]
        if not any(r in reason for reason in reasons for r in RETRY_ON):
            said = "; ".join(out.server[-3:]) or out.message or ", ".join(reasons)
            raise GitLeaseError(
                f"the push of {path} to {where} was refused ({said}): a protected branch? then write it here "
                f"with --no-push and commit it through review",
                path=path,
                reasons=reasons,
            )
        sleep(random.uniform(0.05, 0.05 * min(tries, 20)))  # another host's change landed first: read again
    raise GitLeaseError(f"gave up after {attempts} pushes of {path}: the default branch of {remote} kept moving")


def add(repo: Repo, settings: Settings, name: str, line: str, **kw: Any) -> Change:
    """Trust one key: ``line`` (``signer_line``) in signer ``name``'s file, in place of a line for the same key."""
    return change(
        repo,
        settings.remote,
        settings.allowed_signers,
        name,
        lambda old: with_line(old, line),
        timeout=settings.timeout,
        **kw,
    )


def remove(repo: Repo, settings: Settings, name: str, **kw: Any) -> Change:
    """Revoke signer ``name``: its file goes. UsageError when there is no such file."""
    got = change(
        repo,
        settings.remote,
        settings.allowed_signers,
        name,
        lambda old: None,
        verb="revoke",
        timeout=settings.timeout,
        **kw,
    )
    if got.action == "unchanged":
        raise UsageError(
            f"no signer file {got.path} on {got.where}: see git lease trust list (a line in the shared trust "
            "file is removed by editing that file)",
            path=got.path,
        )
    return got


def key_of(value: str) -> str:
    """The public key (``ssh-ed25519 AAAA...``) of a key given as a private key file, a public key file, or the
    key itself (ConfigError, exit 1, when it is none of those)."""
    from gitlease.identity.signer import load_signer

    got = load_signer(value).public_key
    assert got is not None
    return got


def _commit_on(repo: Repo, parent: str, path: str, data: bytes | None, message: str) -> str:
    """A commit whose parent is ``parent`` and whose tree is ``parent``'s with ``path`` set to ``data`` (or
    removed), made in a temporary index: the work tree, the index and the branches here are not touched.
    Signed when this clone signs its commits (``commit.gpgSign``, set up by ``git lease init``)."""
    cwd = repo.cwd
    with tempfile.TemporaryDirectory(prefix="gitlease-trust-") as tmp:
        scratch = gitq.with_index(cwd, os.path.join(tmp, "index"))
        gitq.read_tree(scratch, parent)
        if data is None:
            gitq.index_remove(scratch, path)
        else:
            gitq.index_add(scratch, path, gitq.hash_object(cwd, data))
        tree = gitq.write_tree(scratch)
        assert tree is not None
    signs = gitq.config_get(cwd, "commit.gpgSign", type="bool") == "true"
    return gitq.commit_tree(cwd, tree, [parent], message, sign=signs)


def _write_here(repo: Repo, path: str, name: str, edit: Edit, *, local: bool, remote: str | None) -> Change:
    """The signer file changed where this clone can see it: beside a local trust file, or in the work tree
    (for the user to commit to the default branch, through review)."""
    if local:
        full = os.path.expanduser(path)
        where = os.path.dirname(full)
        steps: list[str] = []
    elif repo.worktree is None:
        raise UsageError("this repository is bare: give --remote (the lease store) to publish a signer file")
    else:
        full = os.path.join(repo.worktree, path)
        where = "the work tree"
        steps = [f"git add -A {path} && git commit -m 'gitlease: trust {name}' and push it to the default branch"]
        if remote is None:
            steps.append("(no lease.remote: the trust is read from this repository's own default branch)")
    try:
        with open(full, "rb") as fh:
            old: bytes | None = fh.read()
    except FileNotFoundError:
        old = None
    new = edit(old)
    if new == old:
        return Change(name, path, "unchanged", where, text=(new or b"").decode("utf-8", "replace"))
    put_file(full, new)
    return Change(name, path, "written", where, text=(new or b"").decode("utf-8", "replace"), next_steps=steps)


@dataclass(frozen=True)
class Entry:
    """One trusted key as readers see it."""

    file: str
    principals: tuple[str, ...]
    namespaces: tuple[str, ...] | None
    fingerprint: str
    admin: bool

    def line(self) -> str:
        spaces = ",".join(self.namespaces) if self.namespaces is not None else "any namespace"
        return f"{self.file}: {','.join(self.principals)}  {self.fingerprint}  ({spaces})"

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "principals": list(self.principals),
            "namespaces": list(self.namespaces) if self.namespaces is not None else None,
            "fingerprint": self.fingerprint,
            "admin": self.admin,
        }


def entries(trust: Trust) -> list[Entry]:
    """Every key a ``Trust`` (identity/trust.py) trusts, with the file it came from."""
    from gitlease.identity.signer import ADMIN_NAMESPACE
    from gitlease.identity.sshsig import fingerprint_of

    out = []
    origins = list(trust.origins) + ["?"] * (len(trust.signers or ()) - len(trust.origins))
    for signer, origin in zip(trust.signers or (), origins):
        try:
            fp = fingerprint_of(signer.key)
        except GitLeaseError:
            fp = signer.key[:30] + "..."
        out.append(Entry(origin, signer.principals, signer.namespaces, fp, signer.allows_namespace(ADMIN_NAMESPACE)))
    return out
