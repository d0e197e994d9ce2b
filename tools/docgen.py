"""What the generators of marked doc tables share (tools/gen_settings_doc.py,
tools/gen_regime_doc.py): the block between two markers of a page, and the command line that
rewrites the pages or, with ``--check``, exits 1 when one is stale."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def splice(page: Path, begin: str, end: str, block: str) -> str:
    """The page's text with ``block`` (which starts with ``begin`` and ends with ``end``) in place
    of what lies between the markers, the markers included."""
    return splice_text(page.read_text(encoding="utf-8"), begin, end, block, str(page))


def splice_text(text: str, begin: str, end: str, block: str, where: str) -> str:
    """``splice`` of a page's ``text`` already in hand (a page with two generated tables)."""
    if begin not in text or end not in text:
        raise SystemExit(f"{where}: add the markers {begin} and {end} where the table goes")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + block + tail


def main(pages: Callable[[], dict[Path, str]], tool: str, doc: str | None, argv: list[str] | None) -> int:
    """Writes each page whose text differs from ``pages()``; with ``--check`` writes nothing, names
    the stale pages and returns 1."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 when a table is stale")
    args = ap.parse_args(argv)
    stale = []
    for page, text in pages().items():
        if page.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            stale.append(page)
        else:
            page.write_text(text, encoding="utf-8")
            print(f"wrote {page}")
    for page in stale:
        print(f"{page} is stale: run {tool}", file=sys.stderr)
    return 1 if stale else 0
