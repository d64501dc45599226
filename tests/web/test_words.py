"""Every problem code the API answers has words on the page (src/space/web/static/words.js), so a person never
reads a bare code such as `unavailable`."""

from __future__ import annotations

import re
from pathlib import Path

from space import errors
from space.notifications.models import NotificationType
from space.problems import _CODES_BY_STATUS

WORDS = Path(errors.__file__).parent / "web" / "static" / "words.js"

# Codes the page never shows a person: `bad_request` and `conflict` are the bases of the tree, never raised
# themselves; the export rate limit has a sentence of its own (with the time to wait) in `problem()`.
NOT_SHOWN = {"bad_request", "conflict", "export_rate_limited", "method_not_allowed", "unsupported_media_type"}


def _codes() -> set[str]:
    found: set[str] = set()
    stack: list[type[errors.SpaceError]] = [errors.SpaceError]
    while stack:
        cls = stack.pop()
        found.add(cls.code)
        stack.extend(cls.__subclasses__())
    return found | set(_CODES_BY_STATUS.values()) | {"internal_error"}


def _problem_words() -> set[str]:
    text = WORDS.read_text()
    block = re.search(r"const PROBLEMS = \{(.*?)\n\};", text, re.S)
    assert block is not None
    return set(re.findall(r"^\s+([a-z_]+):", block.group(1), re.M))


def test_every_problem_code_has_words() -> None:
    missing = _codes() - NOT_SHOWN - _problem_words()
    assert not missing, f"words.js has no words for {sorted(missing)}"


def test_the_codes_of_issue_29_have_words() -> None:
    assert {"webhook_limit_reached", "rate_limited", "unavailable"} <= _problem_words()


def test_every_email_type_has_words_in_the_preferences_form() -> None:
    block = re.search(r"const EMAIL_TYPES = \{(.*?)\n\};", WORDS.read_text(), re.S)
    assert block is not None
    labelled = set(re.findall(r'^\s+"([a-z_.]+)":', block.group(1), re.M))
    assert labelled == {t.value for t in NotificationType}
