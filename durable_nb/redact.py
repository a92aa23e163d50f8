"""Secret-looking literals taken out of a cell's source before it is journaled.

A run keeps the source of the cell that started it (``RunRecord.source``), shown by the
export and copied with the run. A key written in the cell (``OpenAI(api_key="sk-...")``)
would be kept with it: :func:`redact_source` replaces, in the text, what looks like a
secret by ``<redacted ...>`` and leaves the rest as it was, so the code stays readable and
its lines where they were:

- keys by their published formats: OpenAI (``sk-``, ``sk-proj-``), Anthropic (``sk-ant-``),
  AWS access key ids (``AKIA``, ``ASIA``) and secret keys (40 mixed-case characters), GitHub
  (``ghp_`` ... ``github_pat_``), Slack (``xox?-``), Google (``AIza``), Stripe
  (``sk_live_``), Hugging Face (``hf_``), JSON web tokens, private key blocks;
- ``Bearer`` tokens;
- the password of a URL (``postgresql://user:PASSWORD@host``, any scheme);
- a string literal given to a name that says it holds a secret: ``api_key=``, ``token=``,
  ``password=``, ``secret=``, ``...access_key``, ``...private_key``, ``X-Api-Key``
  (keyword arguments, assignments, annotated assignments, dict entries, ``["NAME"] =``).

It is a filter by patterns, not a proof: a secret in a form none of these matches (a bare
string in a call that does not name it, a concatenation) stays. Keys belong in the
environment (``os.environ["OPENAI_API_KEY"]``), which the journal never sees.
"""

from __future__ import annotations

import re

__all__ = ["names_a_secret", "redact_source"]

_REDACTED = "<redacted>"

#: (pattern, replacement) applied in order; a replacement may keep groups that are no secret.
_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?-----END \1PRIVATE KEY-----",
                re.DOTALL), r"<redacted \1private key>"),
    (re.compile(r"\bsk-ant-[A-Za-z0-9_-]{20,}"), "<redacted Anthropic key>"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), "<redacted OpenAI key>"),
    (re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"), "<redacted Stripe key>"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "<redacted AWS key id>"),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,}"), "<redacted GitHub token>"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), "<redacted GitHub token>"),
    (re.compile(r"\bxox[abposre]-[A-Za-z0-9-]{10,}"), "<redacted Slack token>"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), "<redacted Google key>"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), "<redacted Hugging Face token>"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
     "<redacted JSON web token>"),
    (re.compile(r"\b([Bb]earer)\s+(?!<redacted)[A-Za-z0-9._~+/=-]{16,}"), rf"\1 {_REDACTED}"),
    # scheme://user:PASSWORD@ (a {placeholder} of an f-string is left).
    (re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^\s/@:'\"]*:)(?!\{[^}]*\}@)([^\s@/'\"]+)@"),
     rf"\1{_REDACTED}@"),
    # An AWS secret access key: 40 characters of base64 with both cases and a digit.
    (re.compile(r"""(["'])(?=[A-Za-z0-9/+]*[a-z])(?=[A-Za-z0-9/+]*[A-Z])"""
                r"""(?=[A-Za-z0-9/+]*[0-9])[A-Za-z0-9/+]{40}\1"""), rf"\1<redacted AWS secret>\1"),
    # A string literal given to a name that says it holds a secret:
    # name = "...", name="..." (keyword), name: T = "...", "name": "...", ["NAME"] = "...".
    (re.compile(r"""(?ix)
        (\b[a-z0-9_]*?(?:api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key|secret
                        |token|password|passwd|pwd)\b
         ["']?\]?
         (?:\s*:\s*[a-z_][\w.]*(?:\[[^\]\n]*\])?\s*=(?!=)|\s*[:=](?!=))\s*
         [rbuf]{0,2})
        (["'])(?!<redacted)(?:\\.|(?!\2)[^\\\n])+\2
        """), rf"\1\2{_REDACTED}\2"),
]


def redact_source(source: str) -> str:
    """``source`` with every secret-looking literal replaced (see the module docstring)."""
    for pattern, replacement in _RULES:
        source = pattern.sub(replacement, source)
    return source


#: A name that says it holds a secret: one that ends in a word the last rule looks for.
_SECRET_NAME = re.compile(r"(?i)(?:api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key"
                          r"|secret|token|password|passwd|pwd)$")


def names_a_secret(name: str) -> bool:
    """Whether ``name`` (a setting's, a field's, a keyword's) says it holds a secret, as the
    names whose string literals :func:`redact_source` replaces do: ``api_key``,
    ``OPENAI_API_KEY``, ``x-api-key``, ``auth_token``, ``password`` (not ``max_tokens``)."""
    return _SECRET_NAME.search(name) is not None
