"""``allowed_signers`` files (ssh-keygen(1), ALLOWED SIGNERS), applied as ``ssh-keygen -Y verify`` does.
Part of gitlease.identity.sshsig."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING

from gitlease.core.errors import InvalidRecord

if TYPE_CHECKING:  # pragma: no cover
    from datetime import datetime


from gitlease.identity.sshsig.patterns import _match_pattern_list
from gitlease.identity.sshsig.wire import _WS, _b64, _Malformed, _parse_key_words, _parse_public_key, _show

# --- allowed signers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllowedSigner:
    """One line of an ``allowed_signers`` file.

    ``principals`` and ``namespaces`` are OpenSSH pattern lists (``*``, ``?``, ``!negation``), split at commas.
    ``key`` is ``"<type> <base64>"`` (any type is kept; only ssh-ed25519 can match our signatures).
    ``namespaces`` None means every namespace. ``valid_after``/``valid_before`` are aware datetimes or None.
    """

    principals: tuple[str, ...]
    key: str
    namespaces: tuple[str, ...] | None = None
    cert_authority: bool = False
    valid_after: datetime | None = None
    valid_before: datetime | None = None

    def allows_namespace(self, namespace: str) -> bool:
        return self.namespaces is None or _match_pattern_list(namespace, ",".join(self.namespaces)) == 1

    def valid_at(self, when: datetime | float | int | None = None) -> bool:
        now = _verify_time(when)
        if self.valid_after is not None and now < self.valid_after:
            return False
        return not (self.valid_before is not None and now > self.valid_before)

    def matches_principal(self, principal: str) -> bool:
        return _match_pattern_list(principal, ",".join(self.principals)) == 1


def parse_allowed_signers(text: str) -> list[AllowedSigner]:
    """Parse ``allowed_signers`` text: ``principals [options] keytype base64 [comment]`` per line.

    Blank lines and ``#`` comments are skipped. Options (comma-separated, values in double quotes):
    ``cert-authority``, ``namespaces="a,b"``, ``valid-after="YYYYMMDD[HHMM[SS]][Z]"``, ``valid-before=...``.
    A line that does not parse raises ``InvalidRecord("allowed signers line N: ...")``."""
    if not isinstance(text, str):
        raise TypeError("allowed signers text must be a str")
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip(_WS)
        if not line or line.startswith("#"):
            continue
        try:
            out.append(_parse_signer_line(line))
        except _Malformed as exc:
            raise InvalidRecord(f"allowed signers line {number}: {exc}") from None
    return out


def _parse_signer_line(line: str) -> AllowedSigner:
    # principals: one word, or a double-quoted string (ssh-keygen's strdelimw)
    if line.startswith('"'):
        close = line.find('"', 1)
        if close < 0:
            raise _Malformed("unterminated quote in principals")
        principals, rest = line[1:close], line[close + 1 :]
        if rest and rest[0] not in _WS:
            raise _Malformed("text after the quoted principals")
    else:
        cut = _first_of(line, _WS)
        principals, rest = line[:cut], line[cut:]
        if '"' in principals:
            raise _Malformed("stray quote in principals")
    if not principals:
        raise _Malformed("empty principals")
    rest = rest.lstrip(_WS)
    if not rest:
        raise _Malformed("missing public key")
    options = ""
    words = rest.split(None, 2)
    try:
        blob = _parse_key_words(words[0], words[1]) if len(words) >= 2 else None
    except _Malformed as exc:
        if words[0].startswith(("ssh-", "ecdsa-", "sk-")):  # a key type, not an option: say what is wrong
            raise _Malformed(f"invalid public key ({exc})") from None
        blob = None
    if blob is None:  # not a key: options first
        cut = _options_end(rest)
        options, rest = rest[:cut], rest[cut:].lstrip(_WS)
        words = rest.split(None, 2)
        if len(words) < 2:
            raise _Malformed("missing public key")
        try:
            blob = _parse_key_words(words[0], words[1])
        except _Malformed as exc:
            raise _Malformed(f"invalid public key ({exc})") from None
    return _apply_options(tuple(principals.split(",")), words[0] + " " + _b64(blob), options)


def _first_of(s: str, chars: str) -> int:
    for i, c in enumerate(s):
        if c in chars:
            return i
    return len(s)


def _options_end(s: str) -> int:
    """Index of the first unquoted space/tab (OpenSSH sshkey_advance_past_options); _Malformed if unbalanced."""
    quoted = False
    i = 0
    while i < len(s) and (quoted or s[i] not in " \t"):
        if s[i] == "\\" and s[i + 1 : i + 2] == '"':
            i += 1
        elif s[i] == '"':
            quoted = not quoted
        i += 1
    if quoted:
        raise _Malformed("unterminated quote in options")
    return i


def _apply_options(principals: tuple[str, ...], key: str, opts: str) -> AllowedSigner:
    """Parse the option list the way OpenSSH sshsigopt_parse does (names case-insensitive)."""
    ca = False
    namespaces: tuple[str, ...] | None = None
    after = before = None
    i = 0
    while i < len(opts):
        low = opts[i:].lower()
        if low.startswith("cert-authority"):
            ca = True
            i += len("cert-authority")
        else:
            for name in ("namespaces", "valid-after", "valid-before"):
                if low.startswith(name + "="):
                    break
            else:
                raise _Malformed(f"unknown option {_show(opts[i:].split(',', 1)[0])}")
            value, i = _dequote(opts, i + len(name) + 1, name)
            if name == "namespaces":
                if namespaces is not None:
                    raise _Malformed('multiple "namespaces" options')
                namespaces = tuple(value.split(",")) if value else ()
            elif name == "valid-after":
                if after is not None:
                    raise _Malformed('multiple "valid-after" options')
                after = _parse_time(value, name)
            else:
                if before is not None:
                    raise _Malformed('multiple "valid-before" options')
                before = _parse_time(value, name)
        if i == len(opts):
            break
        if opts[i] != ",":
            raise _Malformed(f"unknown option {_show(opts[i:].split(',', 1)[0])}")
        i += 1
        if i == len(opts):
            raise _Malformed("options end with a comma")
    if after is not None and before is not None and before <= after:
        raise _Malformed('"valid-before" is not after "valid-after"')
    return AllowedSigner(principals, key, namespaces, ca, after, before)


def _dequote(s: str, i: int, name: str) -> tuple[str, int]:
    """A double-quoted option value at s[i] (backslash may escape a quote) and the index after it."""
    if s[i : i + 1] != '"':
        raise _Malformed(f"{name} value must be in double quotes")
    i += 1
    out = []
    while i < len(s) and s[i] != '"':
        if s[i] == "\\" and s[i + 1 : i + 2] == '"':
            i += 1
        out.append(s[i])
        i += 1
    if i == len(s):
        raise _Malformed(f"{name} value has no closing quote")
    return "".join(out), i + 1


def _parse_time(value: str, name: str) -> datetime:
    """YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS, local time, or UTC with a ``Z``/``UTC`` suffix (OpenSSH)."""
    from datetime import datetime

    digits, utc = value, False
    if len(digits) > 1 and digits[-1] in "Zz":
        digits, utc = digits[:-1], True
    elif len(digits) > 3 and digits[-3:].upper() == "UTC":
        digits, utc = digits[:-3], True
    if len(digits) not in (8, 12, 14) or not (digits.isascii() and digits.isdigit()):
        raise _Malformed(f"invalid {name} time {_show(value)} (expected YYYYMMDD[HHMM[SS]][Z])")
    year, month, day = int(digits[:4]), int(digits[4:6]), int(digits[6:8])
    hour, minute, second = (int(digits[j : j + 2]) if j < len(digits) else 0 for j in (8, 10, 12))
    try:
        if utc:
            return datetime(year, month, day, hour, minute, second, tzinfo=UTC)
        return datetime(year, month, day, hour, minute, second).astimezone()
    except (ValueError, OverflowError, OSError):
        raise _Malformed(f"invalid {name} time {_show(value)}") from None


def _verify_time(when: datetime | float | int | None) -> datetime:
    """``when`` as an aware datetime in whole seconds (naive = local time; numbers = Unix time; None = now)."""
    from datetime import datetime

    if when is None:
        when = datetime.now(UTC)
    elif isinstance(when, (int, float)) and not isinstance(when, bool):
        when = datetime.fromtimestamp(when, UTC)
    elif not isinstance(when, datetime):
        raise TypeError("when must be a datetime, a Unix time or None")
    elif when.tzinfo is None:
        when = when.astimezone()
    return when.replace(microsecond=0)


def _canonical_key(key: str) -> str | None:
    try:
        blob = _parse_public_key(key)
    except _Malformed:
        return None
    return key.split()[0] + " " + _b64(blob)


def principals_for(
    signers: Iterable[AllowedSigner], key: str, namespace: str, when: datetime | float | int | None = None
) -> list[str]:
    """The principal patterns of every entry that lists ``key`` (plain, not cert-authority), allows
    ``namespace`` and is valid at ``when`` (default now), in file order without repeats."""
    wanted = _canonical_key(key)
    now = _verify_time(when)
    out: list[str] = []
    for s in signers:
        if (
            wanted is not None
            and not s.cert_authority
            and s.key == wanted
            and s.allows_namespace(namespace)
            and s.valid_at(now)
        ):
            out.extend(p for p in s.principals if p not in out)
    return out


def allowed(
    signers: Iterable[AllowedSigner],
    principal: str,
    key: str,
    namespace: str,
    when: datetime | float | int | None = None,
) -> bool:
    """Whether some entry matches ``principal`` (OpenSSH pattern list), lists ``key``, allows ``namespace`` and
    is valid at ``when`` (default now): what ``ssh-keygen -Y verify -I principal -n namespace`` checks."""
    wanted = _canonical_key(key)
    if wanted is None:
        return False
    now = _verify_time(when)
    return any(
        not s.cert_authority
        and s.key == wanted
        and s.matches_principal(principal)
        and s.allows_namespace(namespace)
        and s.valid_at(now)
        for s in signers
    )
