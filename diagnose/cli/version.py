"""diag --version: the installed distribution's version; in a source checkout
that was never installed, the version pyproject.toml gives, said to be one."""
from __future__ import annotations

import os
import re
from importlib import metadata

DISTRIBUTION = "hangscope"
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERSION_LINE = re.compile(r'^version\s*=\s*"([^"]+)"', re.MULTILINE)


def package_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return _checkout_version() or "unknown (not installed, and no pyproject.toml beside it)"


def _checkout_version() -> str | None:
    try:
        with open(os.path.join(CHECKOUT, "pyproject.toml")) as source:
            text = source.read(1 << 16)
    except OSError:
        return None
    found = VERSION_LINE.search(text)
    return f"{found[1]} (source checkout at {CHECKOUT})" if found else None
