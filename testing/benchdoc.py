"""Writing a benchmark's section into a document (docs/performance.md, docs/reliability.md): the section sits
between its own ``<!-- name:begin -->`` and ``<!-- name:end -->`` markers, so each benchmark rewrites only its
part and keeps the others'."""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of the section ``name``."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def replace_section(text: str, section: str, begin: str, end: str, heading: str = "") -> str:
    """``text`` with the part from ``begin`` to ``end`` (both included) replaced by ``section`` (which carries
    the markers itself), or ``section`` appended when the markers are not both there (under ``heading``, a
    markdown heading line, when one is given)."""
    section = section.rstrip("\n") + "\n"
    if begin in text and end in text[text.index(begin) :]:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        return head + section + ("\n" + tail if tail else "")
    return text.rstrip("\n") + "\n\n" + (heading + "\n\n" if heading else "") + section


def write_section(
    path: Path | str, section: str, begin: str, end: str, *, title: str = "# Performance", heading: str = ""
) -> None:
    """Replace (or append, under ``heading``) ``section`` in the file at ``path``; a missing file starts with
    ``title``."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else title + "\n"
    path.write_text(replace_section(text, section, begin, end, heading), encoding="utf-8")
