"""CI jobs that sweep stale leases on a schedule, shipped inside the package, and how they are installed.

``render(kind, install)`` gives the file's text; ``install(root, kind, ...)`` writes it into a repository and
says what else the user has to do (docs/sweeping.md). No printing here: the CLI renders what it returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources

from gitlease.core.errors import GitLeaseError, UsageError

KINDS = {
    "github": ("github-sweep.yml", ".github/workflows/gitlease-sweep.yml"),
    "gitlab": ("gitlab-sweep.yml", ".gitlab/gitlease-sweep.yml"),
}
GITLAB_CI = ".gitlab-ci.yml"


def default_install_spec() -> str:
    from gitlease import __version__

    return f"gitlease=={__version__}"


def render(kind: str, install: str | None = None) -> str:
    if kind not in KINDS:
        raise UsageError(f"unknown CI kind {kind!r}: choose one of {', '.join(KINDS)}")
    spec = install or default_install_spec()
    if any(c in spec for c in '"\n\r$`\\'):
        raise UsageError("the install spec may not contain quotes, '$', '`', backslashes or newlines")
    text = resources.files(__name__).joinpath(KINDS[kind][0]).read_text(encoding="utf-8")
    return text.replace("@INSTALL@", spec)


@dataclass
class Installed:
    kind: str
    written: list[str] = field(default_factory=list)  # repo-relative paths written
    unchanged: list[str] = field(default_factory=list)  # already up to date
    next_steps: list[str] = field(default_factory=list)


def install(root: str, kind: str, *, install_spec: str | None = None, overwrite: bool = False) -> Installed:
    text = render(kind, install_spec)
    out = Installed(kind)
    _write(root, KINDS[kind][1], text, overwrite, out)
    if not install_spec:
        out.next_steps.append(
            f"the job runs `pip install {default_install_spec()}`: make sure your package index "
            "serves this project under that name, or pass --install (a git URL, a wheel)"
        )
    if kind == "github":
        out.next_steps.append("commit and push it to the default branch (GitHub runs schedules only from there)")
        out.next_steps.append(
            "it sweeps every 5 minutes at best, often later; Actions > gitlease sweep > Run workflow sweeps now"
        )
        return out
    ci = os.path.join(root, GITLAB_CI)
    include = f"include:\n  - local: {KINDS[kind][1]}\n"
    if not os.path.exists(ci):
        _write(root, GITLAB_CI, include, False, out)
    else:
        with open(ci, encoding="utf-8") as fh:
            if KINDS[kind][1] not in fh.read():
                out.next_steps.append(f"add to {GITLAB_CI}: include: [{{local: {KINDS[kind][1]}}}]")
    out.next_steps.append("create a pipeline schedule (CI/CD > Schedules, */5 * * * *) with variable GITLEASE_SWEEP=1")
    out.next_steps.append(
        "add a masked CI/CD variable GITLEASE_PUSH_TOKEN: a project access token with "
        "write_repository (the job token cannot push)"
    )
    return out


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
