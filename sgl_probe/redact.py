"""Redact secrets found in values, not only in names.

An allow-listed variable or a server argument may carry a credential in its value: a URL with
``user:password@``, a token (``hf_...``, ``sk-...``, ``ghp_...``, a JWT, an AWS key id), a
``password=...`` pair, or the value of a flag such as ``--api-key``. Each is replaced by
:data:`REDACTED`, keeping the rest of the value readable (the host of a URL, the key of a pair),
so that two runs can still be compared. Stdlib only; every function is pure and never raises on
a string.
"""

from __future__ import annotations

import re
from typing import Iterable

REDACTED = "<redacted>"

#: Words that make a flag or a ``key=value`` key secret. Whole words only (split on ``-``, ``_``,
#: ``.``): ``--max-total-tokens`` and ``tokenizer_mode`` are ordinary settings.
SECRET_WORDS = frozenset({
    "key", "apikey", "secret", "password", "passwd", "pwd", "token", "credential",
    "credentials", "auth", "authorization", "cookie", "sig", "signature", "bearer",
})

_WORD_SPLIT = re.compile(r"[-_.\s]+")

# scheme://user:password@host -> scheme://user:<redacted>@host
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<secret>[^/\s@]+)(?=@)")

_TOKENS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"hf_[A-Za-z0-9]{8,}"                          # Hugging Face
    r"|sk-[A-Za-z0-9_-]{16,}"                      # OpenAI / Anthropic style
    r"|gh[pousr]_[A-Za-z0-9]{20,}"                 # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{20,}"               # GitHub fine-grained tokens
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # JWT (base64url JSON header)
    r"|(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}"        # AWS access key id
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"              # Slack
    r")(?![A-Za-z0-9])"
)

# key=value / key: value / "key": "value" inside a value (query strings, connection strings,
# JSON), where the key holds a secret word. Only such keys match, so ordinary text is not consumed
# (a URL's query string is still searched after its host).
_PAIR = re.compile(
    r"(?P<key>(?<![A-Za-z0-9_.-])[A-Za-z0-9_.-]*?(?<![A-Za-z0-9])(?:"
    + "|".join(sorted(SECRET_WORDS, key=len, reverse=True))
    + r")(?![A-Za-z0-9])[A-Za-z0-9_.-]*)(?P<q1>[\"']?)(?P<sep>\s*[=:]\s*)(?P<q2>[\"']?)"
    r"(?P<value>[^\s&;,'\"{}\[\]]+)", re.I)


def secret_word(name: str) -> bool:
    """Whether a flag or key name (``--admin-api-key``, ``aws_secret``) names a secret."""
    return any(w in SECRET_WORDS for w in _WORD_SPLIT.split(name.lower().lstrip("-")) if w)


def _hf_like(token: str) -> bool:
    # ``hf_transfer`` is a value users set; real tokens mix case or digits.
    rest = token[3:]
    return any(c.isdigit() or c.isupper() for c in rest)


def _token_sub(m: re.Match) -> str:
    tok = m.group(0)
    if tok.startswith("hf_") and not _hf_like(tok):
        return tok
    return REDACTED


def _pair_sub(m: re.Match) -> str:
    if m.group("value") == REDACTED:
        return m.group(0)
    # A URL's scheme (``https://``) is not a key: the pattern only sees ``https:`` + ``//...``.
    if m.group("sep").strip() == ":" and m.group("value").startswith("//"):
        return m.group(0)
    return m.group("key") + m.group("q1") + m.group("sep") + m.group("q2") + REDACTED


def redact_value(value: str) -> str:
    """``value`` with every secret-shaped part replaced by :data:`REDACTED`."""
    if not isinstance(value, str) or not value:
        return value
    out = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, value)
    out = _TOKENS.sub(_token_sub, out)
    return _PAIR.sub(_pair_sub, out)


def redact_args(argv: Iterable[str]) -> list[str]:
    """A command line with the values of secret-named flags and secret-shaped values redacted.

    ``--api-key X`` and ``--api-key=X`` both become ``--api-key <redacted>`` / ``=<redacted>``;
    every other item goes through :func:`redact_value` (URLs, tokens, ``key=value`` pairs).
    """
    out: list[str] = []
    hide_next = False
    for item in argv:
        item = str(item)
        if hide_next:
            hide_next = False
            if not item.startswith("--"):
                out.append(REDACTED)
                continue
        if item.startswith("-") and len(item) > 1 and not item[1:2].isdigit():
            flag, eq, _ = item.partition("=")
            if secret_word(flag):
                if eq:
                    out.append(flag + "=" + REDACTED)
                else:
                    out.append(item)
                    hide_next = True
                continue
        out.append(redact_value(item))
    return out
