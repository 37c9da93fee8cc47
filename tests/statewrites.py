"""A scan of source for writes of a record's ``state`` that bypass its ``set_state``
(tests/test_lifecycle.py runs it over the package)."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

PACKAGE = ("shared", "services", "trainer", "planning", "simulator", "cli")
RECORD_CLASSES = {"Job", "NodeRecord", "WorkerRecord"}
# The one method of each record that writes its state; every other writer goes through it.
WRITERS = {("Job", "_move"), ("NodeRecord", "set_state"), ("WorkerRecord", "set_state")}


class StateWrites(ast.NodeVisitor):
    """Each write of an attribute ``state`` outside the records' own writers, as 'line: code'.

    ``self.state = ...`` in a class that is not a record is that object's own (a service's
    store, a lease's state), not a record's."""

    def __init__(self) -> None:
        self.scope: list[tuple[str, str]] = []  # (kind, name), outermost first
        self.found: list[str] = []

    def _enter(
        self, kind: str, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    ) -> None:
        self.scope.append((kind, node.name))
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._enter("class", node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._enter("def", node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._enter("def", node)

    def _allowed(self, owner: ast.expr) -> bool:
        if not (isinstance(owner, ast.Name) and owner.id == "self"):
            return False
        classes = [name for kind, name in self.scope if kind == "class"]
        method = next((name for kind, name in reversed(self.scope) if kind == "def"), "")
        cls = classes[-1] if classes else ""
        return cls not in RECORD_CLASSES or (cls, method) in WRITERS

    def _targets(self, target: ast.expr) -> Iterator[ast.expr]:
        if isinstance(target, ast.Tuple | ast.List):
            for item in target.elts:
                yield from self._targets(item)
        elif isinstance(target, ast.Starred):
            yield from self._targets(target.value)
        else:
            yield target

    def _check(self, node: ast.stmt, targets: Sequence[ast.expr]) -> None:
        for target in (t for top in targets for t in self._targets(top)):
            if not isinstance(target, ast.Attribute) or target.attr != "state":
                continue
            if not self._allowed(target.value):
                self.found.append(f"{node.lineno}: {ast.unparse(node)}")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check(node, node.targets)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check(node, [node.target])

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check(node, [node.target] if node.value is not None else [])

    def visit_Call(self, node: ast.Call) -> None:
        if _sets_state_by_name(node) or _copies_with_state(node):
            self.found.append(f"{node.lineno}: {ast.unparse(node)}")
        self.generic_visit(node)


def _sets_state_by_name(call: ast.Call) -> bool:
    """``setattr(x, "state", ...)`` or ``object.__setattr__(x, "state", ...)``."""
    if ast.unparse(call.func) not in ("setattr", "object.__setattr__") or len(call.args) < 2:
        return False
    name = call.args[1]
    return isinstance(name, ast.Constant) and name.value == "state"


def _copies_with_state(call: ast.Call) -> bool:
    """``x.model_copy(update={"state": ...})`` (or ``update=dict(state=...)``)."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "model_copy"):
        return False
    update = next((k.value for k in call.keywords if k.arg == "update"), None)
    if isinstance(update, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "state" for k in update.keys)
    if isinstance(update, ast.Call) and ast.unparse(update.func) == "dict":
        return any(k.arg == "state" for k in update.keywords)
    return False


def state_writes(source: str) -> list[str]:
    visitor = StateWrites()
    visitor.visit(ast.parse(source))
    return visitor.found
