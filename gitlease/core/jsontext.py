"""JSON text as gitlease writes it: sorted keys, every string valid Unicode (``text_only``), and pieces of text
already written (``Raw``: a lease's JSON from its kept template, service/viewcache.py) put in unchanged.
"""

from __future__ import annotations

import json
from typing import Any


class Raw:
    """JSON text written already (one value, complete and valid, written by ``dumps``: no lone surrogate in it):
    ``dumps`` puts it in as it is."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_MARK = "\x00gitlease-raw\x00"
_MARK_TEXT = json.dumps(_MARK)  # how json writes the placeholder: no JSON text of ours holds it (a NUL escaped)


def dumps(doc: Any) -> str:
    """``doc`` as JSON text with sorted keys; each ``Raw`` in it put in as its text; written again with
    ``text_only`` when a string holds a lone surrogate (bytes that were not UTF-8)."""
    raws: list[str] = []
    text = _dumps(doc, raws)
    if "\\ud" in text:  # a surrogate (escaped, as json writes every non-ASCII character): redo it with text_only
        raws.clear()
        text = _dumps(text_only(doc), raws)
    return _splice(text, raws)  # Raw text holds none: it was written by this function


def _dumps(doc: Any, raws: list[str]) -> str:

    def placeholder(obj: Any) -> str:
        if isinstance(obj, Raw):
            raws.append(obj.text)
            return _MARK
        raise TypeError(f"{type(obj).__name__} is not JSON")

    return json.dumps(doc, sort_keys=True, default=placeholder)


def _splice(text: str, raws: list[str]) -> str:
    if not raws:
        return text
    parts = text.split(_MARK_TEXT)  # the encoder asks in the order it writes: the k-th mark is the k-th Raw
    if len(parts) != len(raws) + 1:  # a string of the document holding the mark itself: never ours
        raise ValueError("a string in the document holds the raw-text placeholder")
    out = [parts[0]]
    for raw, part in zip(raws, parts[1:]):
        out.append(raw)
        out.append(part)
    return "".join(out)


def text_only(obj: Any) -> Any:
    """``obj`` with every string made valid Unicode: bytes that were not UTF-8 (ref names and paths are bytes;
    they arrive as surrogate escapes) written ``\\xNN``, so that the JSON holds no lone surrogate, which
    strict parsers refuse. ``Raw`` text is left as it is (written from ``text_only`` values already)."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
            return obj
        except UnicodeEncodeError:
            return obj.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(obj, dict):
        return {text_only(k): text_only(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [text_only(v) for v in obj]
    return obj
