"""Why a plain script died, from what it wrote: the tail of its per-rank log.

A script that does not use Unicron's training API reports nothing in-band; when it exits
non-zero its agent reads the last ``TAIL_BYTES`` of its stdout+stderr and takes the last Python
exception (``Type: message`` after the last ``Traceback``, with the exceptions of its chain) or,
failing that, the C++ exception the process aborted on (``terminate called after throwing an
instance of 'gloo::EnforceNotMet'`` then ``what():  …``: one thrown on a library's own thread,
which no Python code could catch) or the last line that names an NCCL / CUDA / gloo error, and
classifies it with the trainer's own classifier, so a script's failure lands in the same
taxonomy as the runtime's.

``dist.init_process_group`` installs an excepthook that writes every line of a traceback as
``[rankN]: <line>`` (``torch.distributed.distributed_c10d``): that prefix is taken off first, or
no line of it would read as a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.trainer.classify import classify_text

TAIL_BYTES = 64 * 1024
MAX_MESSAGE = 4000
MAX_LINES = 20  # of one exception's message: NCCL's come with a few lines of detail
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
# "pkg.mod.SomeError: text", "KeyboardInterrupt", "torch.OutOfMemoryError: …"
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_ERROR_NAME = re.compile(r"(Error|Exception|Exit|Interrupt|Failure|Fault)$")
# torch's excepthook: f"[rank{rank}]: {line}" for each non-empty line of the traceback
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ", re.MULTILINE)
# What the C++ runtime and the interpreter write as a process dies after the traceback (a gloo
# thread still running at exit calls std::terminate in some runs): not the message.
_DEATH_RATTLE = re.compile(
    r"^(terminate called |Fatal Python error: |Current thread 0x|Thread 0x|Extension modules: )"
)

# std::terminate's words for an uncaught C++ exception: its type, then its what() below.
_UNCAUGHT = re.compile(
    r"^terminate called after throwing an instance of '([^']+)'\n\s*what\(\):\s*(.*)$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class ScriptFailure:
    exc_type: str
    message: str
    category: FailureCategory


def read_tail(path: Path, size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of the file as text; '' when it cannot be read."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _exception_block(lines: list[str]) -> tuple[str, list[str]] | None:
    """(type, message lines) of the exception that ends a traceback's ``lines``."""
    body = [line for line in lines if line.strip()]
    index = next((i for i, line in enumerate(body) if not line[:1].isspace()), None)
    if index is None:  # frames only: the exception line is indented (a SyntaxError's caret)
        return None
    match = _EXCEPTION_LINE.match(body[index])
    if match is None:
        return None
    rest = [match.group(2) or "", *_message_lines(body[index + 1 : index + MAX_LINES])]
    return match.group(1).rsplit(".", 1)[-1], rest


def _message_lines(lines: list[str]) -> list[str]:
    """The lines of an exception's message that follow its first: up to the process's death
    rattle, if any."""
    end = next((i for i, line in enumerate(lines) if _DEATH_RATTLE.match(line)), len(lines))
    return lines[:end]


def _split_chain(text: str) -> list[list[str]]:
    """The tracebacks of the last exception chain, oldest first, each as its lines."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return []
    chain_start = start
    while True:
        before = text[:chain_start].rstrip()
        if not before.endswith(_CHAINED):
            break
        earlier = before.rfind(_TRACEBACK)
        if earlier < 0:
            break
        chain_start = earlier
    blocks = text[chain_start:].split(_TRACEBACK)[1:]
    cleaned = []
    for block in blocks:
        for marker in _CHAINED:
            block = block.replace(marker, "")
        cleaned.append(block.splitlines())
    return cleaned


def _from_traceback(text: str) -> tuple[str, str] | None:
    """(type, message) of the last exception, its causes appended as ``Type: message``."""
    parsed = [b for b in (_exception_block(lines) for lines in _split_chain(text)) if b]
    if not parsed:
        return None
    exc_type, last = parsed[-1]
    message = "\n".join(line for line in last if line).strip()
    causes = [f"{kind}: {' '.join(lines).strip()}" for kind, lines in reversed(parsed[:-1])]
    return exc_type, "\n".join([message, *causes]).strip()


def _from_uncaught(text: str) -> tuple[str, str] | None:
    """(C++ type, what()) of the last uncaught C++ exception; what() may span lines (NCCL's
    details), up to a blank line or the rest of the death rattle."""
    found = list(_UNCAUGHT.finditer(text))
    if not found:
        return None
    last = found[-1]
    after = text[last.end() :].split("\n")[1:MAX_LINES]
    blank = next((i for i, line in enumerate(after) if not line.strip()), len(after))
    message = "\n".join([last.group(2).rstrip(), *_message_lines(after[:blank])])
    return last.group(1), message.strip()


def _from_lines(text: str) -> tuple[str, str] | None:
    """Without a traceback: the last ``SomeError: …`` line with what follows it, or the last
    line the classifier recognises (an NCCL, CUDA or gloo error)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if _error_line(lines[i]):
            while i > 0 and _error_line(lines[i - 1]):  # "XError: …" then "ncclYError: …"
                i -= 1
            name, first = _error_line(lines[i]) or ("", "")
            return name, "\n".join([first, *_message_lines(lines[i + 1 : i + MAX_LINES])]).strip()
        if classify_text("", lines[i]) != FailureCategory.SOFTWARE_OTHER:
            return "", lines[i].strip()
    return None


def _error_line(line: str) -> tuple[str, str] | None:
    """(bare type, message) of a ``pkg.SomeError: message`` line."""
    match = _EXCEPTION_LINE.match(line)
    if match is None or match.group(2) is None:
        return None
    name = match.group(1).rsplit(".", 1)[-1]
    return (name, match.group(2)) if _ERROR_NAME.search(name) else None


def failure_of(exc_type: str, message: str) -> ScriptFailure:
    message = message[:MAX_MESSAGE]
    return ScriptFailure(exc_type, message, classify_text(exc_type, message))


def split_exception(text: str) -> ScriptFailure:
    """``"pkg.SomeError: message"`` (the message may span lines) as a failure; a text that
    names no type is all message."""
    head, _, rest = text.strip().partition("\n")
    match = _EXCEPTION_LINE.match(head)
    if match is None:
        return failure_of("", text.strip())
    message = "\n".join(part for part in (match.group(2) or "", rest) if part)
    return failure_of(match.group(1).rsplit(".", 1)[-1], message)


def classify_traceback(text: str) -> ScriptFailure | None:
    """The last exception of a formatted traceback (``traceback.format_exc()``), its causes
    appended; None when the text holds none."""
    found = _from_traceback(_RANK_PREFIX.sub("", text))
    return None if found is None else failure_of(*found)


def classify_log(text: str) -> ScriptFailure | None:
    """The failure the text of a dead worker's log tells of, or None when it tells of none."""
    text = _RANK_PREFIX.sub("", text)
    found = _from_traceback(text) or _from_uncaught(text) or _from_lines(text)
    return None if found is None else failure_of(*found)
