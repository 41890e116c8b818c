"""A notification's text as each target's markup reads it.

A notification's ``text`` carries words gbroker did not write: a job's name
(Slurm shows whatever the owner sets with ``scontrol update Name=``), a
reason quoting it, a group's name. Sent as they are, they are markup: in a
Slack or Mattermost webhook ``<!channel>`` pings everyone and
``<https://evil.example|sign in again>`` is a link that reads as gbroker's own
words; in mail a CR or LF in the subject starts a header of its own; on a
terminal an ESC sequence retitles or clears it.

Each target gets the text written for its markup (``broker.ops.outbox``
calls these at delivery, so a row queued before is sent the same way); the
payload's other fields (``message``, ``job``) stay as they are, for programs.
"""

from __future__ import annotations

import re

from broker import joblog

_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f]")
WORD_JOINER = "\u2060"
"""Invisible, and no markup reads past it: ``@\u2060channel`` shows @channel and mentions nobody."""
SUBJECT_MAX = 200


def _escaped(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def plain(text: str) -> str:
    """Text with its control characters shown escaped, as ``gbroker logs`` shows them (ESC as
    ``\\x1b``); newlines and tabs stay."""
    return joblog.shown(text)


def for_chat(text: str) -> str:
    """Text for Slack's mrkdwn (and Mattermost's Slack-compatible webhooks): shown, never read as markup.

    ``&``, ``<`` and ``>`` become ``&amp;`` ``&lt;`` ``&gt;`` (Slack's rule; so no
    ``<!channel>``, ``<@U123>`` or ``<url|label>``); an ``@`` before a word and a
    Markdown link's ``](`` get a word joiner, so Mattermost neither mentions
    (``@channel``, ``@all``) nor links (``[label](url)``); control characters are
    escaped.
    """
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"@(?=\w)", "@" + WORD_JOINER, text)
    text = text.replace("](", "]" + WORD_JOINER + "(")
    return plain(text)


def header(text: str) -> str:
    """A mail header's value: one line (no CR or LF, control characters escaped), at most 200 characters.

    Non-ASCII is left to the e-mail package, which encodes it (RFC 2047).
    """
    one_line = " ".join(text.replace("\r", "\n").split("\n"))
    return _CONTROL_OR_NEWLINE.sub(_escaped, one_line)[:SUBJECT_MAX]
