"""The README and docs/ hold what a new user reads first: the README links every page of
docs/, and no page tells users to install a package that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def test_the_readme_links_every_page_of_docs() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)\)", README.read_text(encoding="utf-8")))
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md")}
    assert pages - linked == set(), f"README.md does not link {sorted(pages - linked)}"
    assert linked - pages == set(), f"README.md links missing pages {sorted(linked - pages)}"


def test_no_page_installs_slipstream_from_pypi() -> None:
    """slipstream is not on PyPI: ``pip install 'slipstream[...]'`` fails; a checkout
    installs its extras with ``pip install -e '.[...]'``."""
    wrong = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in [README, *sorted(DOCS.glob("*.md"))]
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"pip install\s+['\"]?slipstream\b", line)
    ]
    assert wrong == []
