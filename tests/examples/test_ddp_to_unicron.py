"""examples/ddp_to_unicron: the DDP script and its Unicron version differ in at most 10 lines."""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_to_unicron"


def code_lines(path: Path) -> list[str]:
    """The script without its module docstring, which says different things on purpose."""
    source = path.read_text()
    docstring = ast.get_docstring(ast.parse(source), clean=False)
    if docstring is not None:
        source = source.split('"""', 2)[2]
    return source.splitlines()


def changed_lines(before: list[str], after: list[str]) -> int:
    """Lines changed, as a reviewer counts them: a replaced block counts its longer side."""
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    return sum(
        max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"
    )


def test_the_unicron_version_changes_at_most_ten_lines() -> None:
    ddp = code_lines(EXAMPLE / "train_ddp.py")
    unicron = code_lines(EXAMPLE / "train_unicron.py")
    changed = changed_lines(ddp, unicron)
    assert 0 < changed <= 10, "\n".join(difflib.unified_diff(ddp, unicron, lineterm=""))


def test_changed_lines_counts_replacements_once_and_deletions() -> None:
    assert changed_lines(["a", "b", "c"], ["a", "B", "c"]) == 1
    assert changed_lines(["a", "b", "c", "d"], ["a", "X", "d"]) == 2
