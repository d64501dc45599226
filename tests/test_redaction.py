"""space.redaction: tokens never reach a log line (SPEC §10, §16). The end-to-end check, uvicorn's access log of
a real `space api` process, is in tests/exports/test_link_downloads_socket.py."""

from __future__ import annotations

import io
import logging

from space.redaction import MASK, RedactTokens, install, redact

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"


def test_redact_masks_link_tokens_and_bearer_credentials() -> None:
    cases = {
        f"GET /orgs/o/exports/e/result?token={TOKEN} HTTP/1.1": f"GET /orgs/o/exports/e/result?token={MASK} HTTP/1.1",
        f"/result?a=1&token={TOKEN}&b=2": f"/result?a=1&token={MASK}&b=2",
        f"/result?TOKEN={TOKEN}#frag": f"/result?TOKEN={MASK}#frag",
        f"next=%2Fresult%3Ftoken%3D{TOKEN}": f"next=%2Fresult%3Ftoken%3D{MASK}",
        f'"/result?token={TOKEN}"': f'"/result?token={MASK}"',
        "Authorization: Bearer spc_abc123-_x": f"Authorization: Bearer {MASK}",
        "authorization: bearer spc_abc, other": f"authorization: bearer {MASK}, other",
    }
    for raw, masked in cases.items():
        assert redact(raw) == masked, raw
    for untouched in ("GET /orgs/o/exports HTTP/1.1", "tokens revoked: 3", "/result?mytoken=1", ""):
        assert redact(untouched) == untouched


def test_the_filter_masks_message_and_arguments_of_every_record() -> None:
    logger = logging.getLogger("space.test-redaction")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.addFilter(RedactTokens())
    logger.propagate = False
    try:
        # uvicorn's access line: the path is an argument.
        logger.warning('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/r?token={TOKEN}", "1.1", 200)
        logger.warning(f"direct /r?token={TOKEN} and Bearer spc_secret")
        logger.warning("%(path)s", {"path": f"/r?token={TOKEN}"})
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert TOKEN not in text and "spc_secret" not in text
    assert text.count(MASK) == 4, text
    assert '"GET /r?token=[redacted] HTTP/1.1" 200' in text


def test_install_puts_one_filter_on_the_request_loggers() -> None:
    install()
    install()
    for name in ("uvicorn.access", "uvicorn.error"):
        assert sum(isinstance(f, RedactTokens) for f in logging.getLogger(name).filters) == 1
