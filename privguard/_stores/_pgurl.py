"""``postgresql://`` ledger locations: the connection string, the ledger's name, a safe label."""

from __future__ import annotations

import math
import re
import urllib.parse

from privguard._errors import InvalidArgumentError

SCHEMES = ("postgresql://", "postgres://")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def is_postgres_url(text: str) -> bool:
    return text.lower().startswith(SCHEMES)


def parse(url: str) -> tuple[str, str, str]:
    """(conninfo for psycopg, ledger name, the URL with any password masked).

    The ``ledger`` query parameter names the ledger (default ``default``); every
    other parameter is passed to libpq as given.

    Example:
        >>> conninfo, name, shown = parse("postgresql://ann:pw@db/b?ledger=team&sslmode=require")
        >>> conninfo
        'postgresql://ann:pw@db/b?sslmode=require'
        >>> name, shown
        ('team', 'postgresql://ann:***@db/b?ledger=team&sslmode=require')
        >>> parse("postgresql://ann@db/budgets")[1:]
        ('default', 'postgresql://ann@db/budgets')

    Raises:
        InvalidArgumentError: not a postgresql:// URL, or a malformed ledger name.
    """
    if not is_postgres_url(url):
        raise InvalidArgumentError("path", _masked(url), "must be a postgresql:// URL")
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        shown = _masked(url).encode("utf-8", "backslashreplace").decode("utf-8")
        raise InvalidArgumentError("path", shown, "must be valid Unicode text (it holds a "
                                   "lone surrogate)") from None
    try:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    except ValueError as exc:
        raise InvalidArgumentError("path", _masked(url), f"must be a valid URL ({exc})") from None
    if _unencoded_password(parts.netloc) or parts.netloc.count("@") > 1 or \
            _credentials_past_authority(url, parts):
        shown = urllib.parse.urlunsplit((parts.scheme, parts.netloc.split(":", 1)[0] + ":***",
                                         "", "", ""))
        raise InvalidArgumentError("path", shown, "must give numeric ports and percent-encode "
                                   "'@', '/', '?' and '#' in a user name or password (%40, "
                                   "%2F, %3F, %23): libpq reads the credentials up to the "
                                   "first '@', and the rest of a password would be shown in "
                                   "messages")
    names = [v for k, v in query if k == "ledger"]
    if len(names) > 1:
        raise InvalidArgumentError("path", _masked(url), "must name one ledger (ledger=NAME)")
    name = names[0] if names else "default"
    if not _NAME.match(name):
        raise InvalidArgumentError("path", _masked(url), "must name the ledger with 1-100 "
                                   "characters among letters, digits, '_', '.' and '-'")
    # Every other parameter reaches libpq exactly as written: decoding and re-encoding
    # would turn a "%20" into "+", which libpq reads as a plus sign (review pgu).
    rest = "&".join(pair for pair in parts.query.split("&")
                    if pair and urllib.parse.unquote_plus(pair.partition("=")[0]) != "ledger")
    conninfo = _unsplit(parts._replace(query=rest))
    return conninfo, name, _masked(url)


def connect_timeout(value: str) -> float | None:
    """A ``connect_timeout`` parameter's value (as libpq's parse of a connection string
    gives it: psycopg's ``conninfo_to_dict``), in seconds: None where libpq would not read
    it as a number (libpq refuses it itself); infinity for zero or less (libpq waits
    indefinitely).

    Example:
        >>> connect_timeout("30"), connect_timeout(" 7 ")
        (30.0, 7.0)
        >>> connect_timeout("0"), connect_timeout("-5")
        (inf, inf)
        >>> connect_timeout("ten") is None
        True
    """
    if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):  # (int() also takes "1_0", "١")
        return None
    seconds = int(value)
    return float(seconds) if seconds > 0 else math.inf


def _unsplit(parts: urllib.parse.SplitResult) -> str:
    """``urlunsplit`` keeping the ``//`` of an empty authority (review rlo2: it wrote
    ``postgresql:///db?host=/tmp``, a Unix socket's URL, as ``postgresql:/db?host=/tmp``,
    which libpq refuses as a connection string).

    Example:
        >>> _unsplit(urllib.parse.urlsplit("postgresql:///db?host=/tmp"))
        'postgresql:///db?host=/tmp'
    """
    text = urllib.parse.urlunsplit(parts)
    if not parts.netloc and parts.scheme and not text.startswith(f"{parts.scheme}://"):
        text = f"{parts.scheme}://" + text[len(parts.scheme) + 1:]
    return text


def secrets(url: str) -> list[str]:
    """Every spelling of a password in ``url`` (authority or ``password=`` parameter, as
    written and percent-decoded), longest first, to scrub from messages."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return []
    found = []
    userinfo = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
    if ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    for pair in parts.query.split("&"):
        key, _, value = pair.partition("=")
        if _is_password_key(key):
            found.append(value)
    spelled = {form for raw in found
               for form in (raw, urllib.parse.unquote(raw), urllib.parse.unquote_plus(raw))}
    return sorted((form for form in spelled if form), key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's message, say) with every spelling of ``url``'s password masked.

    Example:
        >>> scrub("bad value: TOP%20SECRET", "postgresql://u:TOP%20SECRET@h/db")
        'bad value: ***'
    """
    for secret in secrets(url):
        text = text.replace(secret, "***")
    return text


def _unencoded_password(netloc: str) -> bool:
    """Whether ``netloc`` (the authority up to the first '/', '?' or '#') ends inside a
    password: no ``@`` in it, and a host's port that is not a number (review pgu).

    ``postgresql://u:pa/ss@db/b`` has the authority ``u:pa``: masked as written, the
    rest of the password would reach every message.

    Example:
        >>> _unencoded_password("u:pa"), _unencoded_password("h1:5432,[::1]:5433")
        (True, False)
    """
    if "@" in netloc:
        return False
    for host in netloc.split(","):
        port = host.rpartition("]")[2].partition(":")[2] if host.startswith("[") \
            else host.rpartition(":")[2] if ":" in host else ""
        if port and not port.isdigit():
            return True
    return False


def _credentials_past_authority(url: str, parts: urllib.parse.SplitResult) -> bool:
    """Whether credentials run past the authority urlsplit found, which then has no ``@``
    (review lo2: a password of digits before its '/', '?' or '#' reads as a port, so
    :func:`_unencoded_password` passed it, and it was shown unmasked).

    libpq reads the credentials up to an ``@`` before the first '/' (a '?' or '#' in the
    password is read as part of it); a '/' in the password ends libpq's authority as well,
    and the rest of the password, up to its '@', becomes the database name.

    Example:
        >>> url = "postgresql://ann:12/34@db/b"
        >>> _credentials_past_authority(url, urllib.parse.urlsplit(url))
        True
    """
    if "@" in parts.netloc:
        return False
    rest = url.split("://", 1)[1] if "://" in url else url
    # review rlo2: a '/' before a '?' or '#' (or the reverse) put the password's '@' in the
    # query or the fragment ("ann:9876/5432?10@db"), which lo2's check did not read: an '@'
    # in the fragment (libpq has none), or in a query parameter before its '=' (no
    # parameter's name holds one; "application_name=a@b" stays accepted)
    return "@" in rest.split("/", 1)[0] or "@" in parts.path or "@" in parts.fragment or \
        any("@" in pair.partition("=")[0] for pair in parts.query.split("&"))


def _is_password_key(key: str) -> bool:
    return urllib.parse.unquote_plus(key).strip().lower() == "password"


def _masked(url: str) -> str:
    """``url`` with the password (in the authority or as a parameter) replaced by ***."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = userinfo.split(":", 1)[0] + ":***@" + host
    query = "&".join(f"{pair.partition('=')[0]}=***" if _is_password_key(pair.partition("=")[0])
                     else pair for pair in parts.query.split("&")) if parts.query else ""
    return _unsplit(parts._replace(netloc=netloc, query=query))


def with_user(url: str, user: str) -> str:
    """The masked ``url`` with another user and no password (what a charging job uses).

    Example:
        >>> with_user("postgresql://admin:pw@db:5433/b?ledger=x", "trainer")
        'postgresql://trainer@db:5433/b?ledger=x'
    """
    parts = urllib.parse.urlsplit(_masked(url))
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{urllib.parse.quote(user)}@{host}"))
