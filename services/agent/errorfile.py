"""torchelastic's error file: the exception a script decorated with ``@record`` wrote itself.

torchrun gives each worker its own ``TORCHELASTIC_ERROR_FILE``, and so does the agent
(:mod:`unicron.services.agent.launch`). ``torch.distributed.elastic.multiprocessing.errors.record``
catches an exception that escapes the decorated function and writes it there as JSON before it
re-raises it (``ErrorHandler.record_exception``)::

    {"message": {"message": "ValueError: …",
                 "extraInfo": {"py_callstack": "Traceback (most recent call last): …",
                               "timestamp": "1700000000"}}}

Some versions write ``"message"`` as a plain string. The file is the first source of why a
script died: it is the exception itself, where the log's tail is whatever else was printed
last. The traceback in ``py_callstack`` is preferred to the one-line message, for its chain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from unicron.services.agent.tracebacks import ScriptFailure, classify_traceback, split_exception

MAX_BYTES = 4 * 1024 * 1024  # a deep stack is large, but a file beyond this is not torch's


def read_error_file(path: Path) -> ScriptFailure | None:
    """The exception the worker recorded in ``path``; None when it wrote none we can read."""
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        data = json.loads(path.read_text("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    return parse_error(data)


def parse_error(data: Any) -> ScriptFailure | None:
    message = data.get("message") if isinstance(data, dict) else None
    text, stack = message, None
    if isinstance(message, dict):
        text = message.get("message")
        extra = message.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    from_stack = classify_traceback(stack) if isinstance(stack, str) else None
    if from_stack is not None:
        return from_stack
    return split_exception(text) if isinstance(text, str) and text.strip() else None
