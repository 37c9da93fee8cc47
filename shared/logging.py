"""Structured logging: one structlog configuration for every service and the CLI."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(service: str, level: str = "INFO", fmt: str = "console") -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s")
    for noisy in ("nats", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


def get_logger(**bound: object) -> structlog.stdlib.BoundLogger:
    # A lazy proxy: module-level loggers pick up the configuration made later at start-up.
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(**bound)
    return logger
