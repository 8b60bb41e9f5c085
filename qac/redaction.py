"""Credentials out of everything we write or log: ``user:password@`` in URLs.

A tracking server or an Optuna database is often given as a URL with its
credentials (``postgresql://user:secret@db/optuna``,
``https://user:token@mlflow.example``). Such a URL must never reach a file
a run record (``mlflow_run.json``), a report, an MLflow param, or the console.
:func:`redact_url` is the one function every writer and logger calls;
:func:`redact_values` applies it to every string in nested params, and
:func:`redact_text` also removes the secrets a library's message quotes
without their URL. A URL with credentials is dialled without them in the
address and with them in an ``Authorization`` header (:func:`split_credentials`).
"""

from __future__ import annotations

import base64
import os
import re
from typing import Any, Mapping
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

REDACTED = "***"
# Query parameters that carry secrets in database and storage URLs.
_SECRET_KEYS = re.compile(r"pass|pwd|secret|token|key|credential|auth", re.IGNORECASE)
# scheme://userinfo@ anywhere in a text (a message, a param value).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s]+)@")


def redact_url(value: str) -> str:
    """``value`` with a URL's ``user:password`` (and secret query values) replaced by ``***``.

    ``postgresql://u:pw@db:5432/optuna`` -> ``postgresql://***@db:5432/optuna``. A
    string that is not a URL with credentials is returned unchanged, so this is
    safe on any path or text; a URL inside a longer text is redacted too.
    """
    if "://" not in value:
        return value
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", value)
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not parts.query or not parts.scheme:
        return text
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if not any(_SECRET_KEYS.search(key) for key, _ in pairs):
        return text
    query = urlencode([(key, REDACTED if _SECRET_KEYS.search(key) else item) for key, item in pairs], safe="*")
    return urlunsplit(parts._replace(query=query))


def redact_values(value: Any) -> Any:
    """A copy of nested params (mappings, lists) with :func:`redact_url` applied to every string."""
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, Mapping):       # plain data or checked parameters (qac.params: sections read as mappings)
        return {key: redact_values(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_values(item) for item in value)
    return value


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without its ``user:password@``, and the user and password (None where absent, unquoted).

    ``https://u:p%40ss@host:8443/x`` -> ``("https://host:8443/x", "u", "p@ss")``. Python's HTTP client
    reads ``user:password@host`` as a host with a port ("nonnumeric port", or a DNS lookup of
    ``user:password@host``), so a URL is dialled without them and they travel as an Authorization header,
    as curl and MLflow's client send them.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url, None, None
    if "@" not in parts.netloc:
        return url, None, None
    host = parts.netloc.rpartition("@")[2]
    user, password = parts.username, parts.password
    return (urlunsplit(parts._replace(netloc=host)), unquote(user) if user else None,
            unquote(password) if password is not None else None)


def basic_authorization(user: str | None, password: str | None) -> str | None:
    """The ``Authorization`` header value HTTP Basic sends for ``user`` and ``password``, or None without a user."""
    if not user:
        return None
    return "Basic " + base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")


# Environment variables whose whole value is a secret (MLFLOW_TRACKING_PASSWORD, HF_TOKEN, AWS_SECRET_ACCESS_KEY).
# A name's word, not a part of one: TOKENIZERS_PARALLELISM holds no secret.
_SECRET_VARIABLE = re.compile(r"(^|_)(PASSWORD|PASSWD|TOKEN|SECRET|API_KEY|ACCESS_KEY|SECRET_KEY|CREDENTIALS?)(_|$)",
                              re.IGNORECASE)
_SHORTEST_SECRET = 4      # shorter values would be replaced inside ordinary words


def url_secrets(url: str) -> list[str]:
    """The secrets written in ``url``: its user information (password, or a token given as the user), and
    the values of its secret query parameters; as written and unquoted."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        found += [userinfo, userinfo.partition(":")[2]]
    found += [value for key, value in parse_qsl(parts.query, keep_blank_values=True) if _SECRET_KEYS.search(key)]
    return [secret for text in found for secret in (text, unquote(text)) if len(secret) >= _SHORTEST_SECRET]


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secrets the environment holds: the values of variables named for a secret, and the credentials
    written in every variable that holds a URL (MLFLOW_TRACKING_URI, QAC_HPO_STORAGE, HF_ENDPOINT, ...)."""
    environ = os.environ if environ is None else environ
    found: list[str] = []
    for name, value in environ.items():
        if _SECRET_VARIABLE.search(name) and len(value) >= _SHORTEST_SECRET:
            found.append(value)
        if "://" in value:
            found += url_secrets(value)
    return found


def redact_text(text: str, *urls: str) -> str:
    """``text`` with every URL's credentials redacted (:func:`redact_url`), and every secret of ``urls`` and of
    the environment (:func:`environment_secrets`) replaced by ``***`` wherever it appears on its own: in a
    library's message that quotes part of a URL (``nonnumeric port: 'pw@host'``) or a traceback's locals."""
    text = redact_url(text)
    secrets = {secret for url in urls for secret in url_secrets(url)} | set(environment_secrets())
    for secret in sorted(secrets, key=len, reverse=True):     # a password inside its user:password first
        text = text.replace(secret, REDACTED)
    return text
