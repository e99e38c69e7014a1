"""CI jobs shipped inside the package, and how they are installed: the scheduled sweep of stale leases
(``sweep``, docs/sweeping.md) and the check of a pull request against the leases (``verify``, docs/hooks.md).

``render(kind, install, job)`` gives a file's text; ``install(root, kind, job=...)`` writes it into a repository
and says what else the user has to do. Both jobs install the same gitlease: this one, pinned to the commit it
was installed from (``default_install_spec``), never a name a package index may not serve. No printing here:
the CLI renders what it returns.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from importlib import resources

from gitlease.core.errors import GitLeaseError, UsageError

KINDS = {
    "github": ("github-sweep.yml", ".github/workflows/gitlease-sweep.yml"),
    "gitlab": ("gitlab-sweep.yml", ".gitlab/gitlease-sweep.yml"),
}
JOBS = ("sweep", "verify")
VERIFY = {
    "github": ("github-verify.yml", ".github/workflows/gitlease-verify.yml"),
    "gitlab": ("gitlab-verify.yml", ".gitlab/gitlease-verify.yml"),
}


def _files(kind: str, job: str) -> tuple[str, str]:
    """(template, where it goes in the repository) of ``job`` for CI ``kind``."""
    if kind not in KINDS:
        raise UsageError(f"unknown CI kind {kind!r}: choose one of {', '.join(KINDS)}")
    if job not in JOBS:
        raise UsageError(f"unknown CI job {job!r}: choose one of {', '.join(JOBS)}")
    return (KINDS if job == "sweep" else VERIFY)[kind]


GITLAB_CI = ".gitlab-ci.yml"


SECRET = "GITLEASE_SIGNING_KEY"  # the CI secret (GitLab: a File-type variable) holding the sweeper's key


def default_install_spec() -> str:
    """What the CI job installs when ``--install`` is not given: this very gitlease, pinned to the commit it was
    installed from (see ``install_spec_for``). UsageError (exit 2) naming the choice when that cannot be told:
    no package index is assumed to serve the name ``gitlease`` (a different project could own it)."""
    from importlib import metadata

    try:
        raw = metadata.distribution("gitlease").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        raw = None
    spec, where = install_spec_for(raw)
    if spec is None:
        raise UsageError(
            f"cannot tell where the CI job should install gitlease from ({where}): pass --install SPEC, e.g. "
            "--install 'git+https://HOST/OWNER/gitlease@COMMIT' (a pinned commit of a repository the runner can "
            "clone), the URL of a wheel, or 'gitlease==VERSION' if your package index serves this project"
        )
    return spec


def install_spec_for(direct_url: str | None) -> tuple[str | None, str]:
    """(pip requirement, where it comes from) for the installation pip described in ``direct_url`` (PEP 610's
    direct_url.json): a VCS install gives ``git+URL@COMMIT``; an install from a local git checkout gives the
    same for the first remote whose remote-tracking branches contain the checked-out commit and whose URL a CI
    runner can reach (not a local path). (None, why) otherwise."""
    import json

    if not direct_url:
        return None, "it was not installed from a URL or a checkout (no direct_url.json): a package index?"
    try:
        doc = json.loads(direct_url)
        url = str(doc["url"])
    except (ValueError, KeyError, TypeError):
        return None, "pip's record of where it came from does not parse"
    vcs = doc.get("vcs_info") if isinstance(doc.get("vcs_info"), dict) else None
    if vcs and vcs.get("vcs") == "git" and vcs.get("commit_id"):
        return f"git+{url}@{vcs['commit_id']}", url
    if not url.startswith("file://"):
        return None, f"installed from {url}, not from a git repository"
    from urllib.parse import unquote, urlparse

    path = unquote(urlparse(url).path)
    return _from_checkout(path)


def _from_checkout(path: str) -> tuple[str | None, str]:
    from gitlease.core import gitq

    commit = gitq.rev_parse_commit(path, "HEAD")
    if commit is None:
        return None, f"installed from {path}, which is not a git checkout"
    remotes = []
    for name in gitq.branches_containing(path, commit):
        remote = name.split("/", 1)[0]
        if remote not in remotes:
            remotes.append(remote)
    for remote in remotes:
        url = gitq.remote_url(path, remote)
        reachable = _pip_git_url(url) if url is not None else None
        if reachable:
            return f"git+{reachable}@{commit}", f"{path} ({remote})"
    return (
        None,
        f"installed from the checkout {path}, whose commit {commit[:12]} is on no remote branch of a repository "
        "a CI runner could clone (push it first?)",
    )


def _pip_git_url(url: str) -> str | None:
    """A git remote URL as pip's ``git+`` takes it, or None for a local path (a runner cannot reach it)."""
    if url.startswith(("https://", "http://", "ssh://", "git://")):
        return url
    if ":" in url and not url.startswith(("/", ".", "file:")) and "@" in url.split(":", 1)[0]:
        user_host, _, rest = url.partition(":")  # scp-like git@github.com:owner/repo.git
        return f"ssh://{user_host}/{rest}"
    return None


def render(kind: str, install: str | None = None, job: str = "sweep") -> str:
    template = _files(kind, job)[0]
    spec = install or default_install_spec()
    if any(c in spec for c in '"\n\r$`\\'):
        raise UsageError("the install spec may not contain quotes, '$', '`', backslashes or newlines")
    text = resources.files(__name__).joinpath(template).read_text(encoding="utf-8")
    return text.replace("@INSTALL@", spec)


@dataclass
class Installed:
    kind: str
    written: list[str] = field(default_factory=list)  # repo-relative paths written
    unchanged: list[str] = field(default_factory=list)  # already up to date
    next_steps: list[str] = field(default_factory=list)


def install(
    root: str, kind: str, *, install_spec: str | None = None, overwrite: bool = False, job: str = "sweep"
) -> Installed:
    dest = _files(kind, job)[1]
    spec = install_spec or default_install_spec()
    text = render(kind, spec, job)
    out = Installed(kind)
    _write(root, dest, text, overwrite, out)
    if not install_spec:
        out.next_steps.append(f"the job runs `pip install {spec}` (this gitlease, pinned); --install SPEC to change")
    if job == "verify":
        return _verify_steps(root, kind, dest, out)
    agent = "gitlease-sweeper-" + kind
    secret = (
        f"a repository secret {SECRET}"
        if kind == "github"
        else f"a File-type CI/CD variable {SECRET} (protected, masked values cannot hold a key)"
    )
    out.next_steps.append(
        f"on a signed store (a trust file on the default branch) the sweeper signs: git lease keygen --agent "
        f"{agent} -o ./{agent}; git lease trust add {agent} --key ./{agent}.pub --agents {agent}; put the "
        f"private key ./{agent} in {secret}; delete the local copy. Without it, the job exits 5 rather than "
        "write reclaims every reader reports INVALID"
    )
    if kind == "github":
        out.next_steps.append("commit and push it to the default branch (GitHub runs schedules only from there)")
        out.next_steps.append(
            "it sweeps every 5 minutes at best, often later; Actions > gitlease sweep > Run workflow sweeps now"
        )
        return out
    _include(root, dest, out)
    out.next_steps.append("create a pipeline schedule (CI/CD > Schedules, */5 * * * *) with variable GITLEASE_SWEEP=1")
    out.next_steps.append(
        "add a masked CI/CD variable GITLEASE_PUSH_TOKEN: a project access token with "
        "write_repository (the job token cannot push)"
    )
    return out


def _verify_steps(root: str, kind: str, dest: str, out: Installed) -> Installed:
    if kind == "github":
        out.next_steps.append(
            "commit and push it; then make 'gitlease verify / verify' a required status check (Settings > "
            "Branches): on github.com this check is the enforcement"
        )
        return out
    _include(root, dest, out)
    out.next_steps.append("make pipelines required to merge (Settings > Merge requests > Pipelines must succeed)")
    return out


def _include(root: str, dest: str, out: Installed) -> None:
    """``dest`` included from .gitlab-ci.yml: a new file saying only that, or a step for the user to add it."""
    ci = os.path.join(root, GITLAB_CI)
    if not os.path.exists(ci):
        _write(root, GITLAB_CI, f"include:\n  - local: {dest}\n", False, out)
        return
    with open(ci, encoding="utf-8") as fh:
        text = fh.read()
    if dest in text:
        return
    lines = text.splitlines()
    ours = lines[:1] == ["include:"] and all(
        re.fullmatch(r"  - local: \.gitlab/gitlease-\w+\.yml", ln) for ln in lines[1:]
    )
    if ours:  # the file another job of ours wrote: one more include
        _write(root, GITLAB_CI, text + f"  - local: {dest}\n", True, out)
    else:
        out.next_steps.append(f"add to {GITLAB_CI}: include: [{{local: {dest}}}]")


def _write(root: str, rel: str, text: str, overwrite: bool, out: Installed) -> None:
    path = os.path.join(root, rel)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            if fh.read() == text:
                out.unchanged.append(rel)
                return
        if not overwrite:
            raise GitLeaseError(f"{rel} exists and differs; move it aside or pass --overwrite", path=rel)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.gitlease-tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    out.written.append(rel)
