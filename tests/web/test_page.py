"""The export center's files over HTTP: public, strict CSP on every answer, no inline code, shipped in the wheel."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from space.web.routes import STATIC_DIR
from tests.helpers import assert_problem

ROOT = Path(__file__).resolve().parents[2]


def _assert_page_headers(headers: object) -> None:
    csp = headers["content-security-policy"]  # type: ignore[index]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"
    assert "unsafe" not in csp and "http" not in csp, csp
    assert headers["x-frame-options"] == "DENY"  # type: ignore[index]
    assert headers["x-content-type-options"] == "nosniff"  # type: ignore[index]


async def test_page_is_public_with_a_strict_policy(client: AsyncTestClient) -> None:  # type: ignore[type-arg]
    r = await client.get("/")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert "Export center" in r.text
    _assert_page_headers(r.headers)


@pytest.mark.parametrize(("name", "media"), [("app.js", "javascript"), ("app.css", "text/css")])
async def test_static_files_are_served_with_the_policy(
    client: AsyncTestClient,  # type: ignore[type-arg]
    name: str,
    media: str,
) -> None:
    r = await client.get(f"/static/{name}")
    assert r.status_code == 200, r.text
    assert media in r.headers["content-type"]
    assert r.content == (STATIC_DIR / name).read_bytes()
    _assert_page_headers(r.headers)


async def test_unknown_static_file_is_a_problem_404(client: AsyncTestClient) -> None:  # type: ignore[type-arg]
    for path in ["/static/missing.js", "/static/../config.py", "/static/%2e%2e/app.py"]:
        r = await client.get(path)
        assert r.status_code == 404, (path, r.status_code)
        if r.headers["content-type"].startswith("application/problem+json"):
            assert_problem(r, 404, "not_found")


async def test_page_is_not_part_of_the_api_document(client: AsyncTestClient) -> None:  # type: ignore[type-arg]
    paths = (await client.get("/schema/openapi.json")).json()["paths"]
    assert "/" not in paths and not any(p.startswith("/static") for p in paths), sorted(paths)


class _Markup(HTMLParser):
    """Collects what the CSP would refuse: inline script or style, event-handler attributes, foreign URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []
        self.refs: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "style" or "style" in found or any(a.startswith("on") for a in found):
            self.inline.append(f"<{tag} {found}>")
        if tag == "script":
            self._in_script = True
            assert found.get("src"), "every script is a file"
        for key in ("src", "href"):
            if found.get(key):
                self.refs.append(str(found[key]))

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False if tag == "script" else self._in_script

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline.append(data)


def test_markup_has_no_inline_code_and_only_own_files() -> None:
    markup = _Markup()
    markup.feed((STATIC_DIR / "index.html").read_text())
    assert markup.inline == []
    assert markup.refs, "the page links its files"
    for ref in markup.refs:
        assert ref.startswith("/static/"), ref
        assert (STATIC_DIR / ref.removeprefix("/static/")).is_file(), ref
    # The modules import only each other, by relative path: no third-party network.
    for js in STATIC_DIR.glob("*.js"):
        for target in re.findall(r"""from\s+["']([^"']+)["']""", js.read_text()):
            assert target.startswith("./") and (STATIC_DIR / target).is_file(), (js.name, target)
        assert "innerHTML" not in js.read_text(), f"{js.name}: text goes in as text"


@pytest.mark.slow
def test_wheel_carries_the_page(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    (wheel,) = tmp_path.glob("space-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in STATIC_DIR.iterdir():
        assert f"space/web/static/{f.name}" in names, f.name
