"""Credentials out of everything we write or log: ``user:password@`` in URLs.

A tracking server or an Optuna database is often given as a URL with its
credentials (``postgresql://user:secret@db/optuna``,
``https://user:token@mlflow.example``). Such a URL must never reach a file
a run record (``mlflow_run.json``), a report, an MLflow param, or the console.
:func:`redact_url` is the one function every writer and logger calls;
:func:`redact_values` applies it to every string in nested params.
"""

from __future__ import annotations

import re
from typing import Any, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

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
