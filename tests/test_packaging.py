"""Packaging: every package folder ships, and the migrations resolve through the installed package."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from space.db.migrate import migrations_dir

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_explicit_package_list_matches_the_folders() -> None:
    """`packages` is written out (packages.find cannot reach migrations/): a new package folder must join it."""
    on_disk: set[str] = set()
    for prefix, folder in SETUPTOOLS["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            on_disk.add(".".join([*([prefix] if prefix else []), *init.parent.relative_to(base).parts]))
    assert set(SETUPTOOLS["packages"]) == on_disk


def test_migrations_resolve_through_the_package() -> None:
    location = migrations_dir()
    assert location.resolve() == (ROOT / "migrations").resolve()
    assert (location / "env.py").is_file()
    assert (location / "versions" / "0001_foundation.py").is_file()


def test_the_worker_loads_no_link_signing_http_client_or_web_framework() -> None:
    """PyJWT (with cryptography) and httpx are 15 MiB of every worker's memory, and a worker needs them only to
    send a webhook (httpx, imported then); it never signs a link. Litestar (6 MiB) is the API's: the worker's
    modules raise space.errors' tree, which knows no HTTP framework (space.problems maps it for the API)."""
    code = (
        "import sys, space.cli, space.worker; "
        "print(sorted(m for m in ('jwt', 'httpx', 'cryptography', 'litestar') if m in sys.modules)); "
        # The S3 store's client brings httpx along (aiobotocore's optional backend), not Litestar.
        "import space.exports.storage.s3; print('litestar' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "False"]
