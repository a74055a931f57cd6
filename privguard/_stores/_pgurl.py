"""``postgresql://`` ledger locations: the connection string, the ledger's name, a safe label."""

from __future__ import annotations

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
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    except ValueError as exc:
        raise InvalidArgumentError("path", _masked(url), f"must be a valid URL ({exc})") from None
    names = [v for k, v in query if k == "ledger"]
    if len(names) > 1:
        raise InvalidArgumentError("path", _masked(url), "must name one ledger (ledger=NAME)")
    name = names[0] if names else "default"
    if not _NAME.match(name):
        raise InvalidArgumentError("path", _masked(url), "must name the ledger with 1-100 "
                                   "characters among letters, digits, '_', '.' and '-'")
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "ledger"])
    conninfo = urllib.parse.urlunsplit(parts._replace(query=rest))
    return conninfo, name, _masked(url)


def password(url: str) -> str | None:
    """The password in ``url`` (authority or ``password=`` parameter), to scrub from messages."""
    try:
        parts = urllib.parse.urlsplit(url)
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return None
    given = [v for k, v in pairs if k.lower() == "password"]
    secret = parts.password or (given[0] if given else None)
    return urllib.parse.unquote(secret) if secret else None


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
    query = parts.query
    if "password" in query.lower():
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = "&".join(f"{k}=***" if k.lower() == "password" else
                         urllib.parse.urlencode([(k, v)]) for k, v in pairs)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def with_user(url: str, user: str) -> str:
    """The masked ``url`` with another user and no password (what a charging job uses).

    Example:
        >>> with_user("postgresql://admin:pw@db:5433/b?ledger=x", "trainer")
        'postgresql://trainer@db:5433/b?ledger=x'
    """
    parts = urllib.parse.urlsplit(_masked(url))
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{urllib.parse.quote(user)}@{host}"))
