"""Entry point: ``python -m services.api`` serves the API with uvicorn."""

from __future__ import annotations

import sys

import uvicorn

from services.api.settings import ApiSettings
from shared.logging import configure_logging, get_logger


def main() -> None:
    settings = ApiSettings()
    configure_logging("api", settings.log_level, settings.log_format)
    # Imported only now: shared.logging.get_logger binds the configuration in force when a
    # module-level logger is created, so modules imported earlier would log unconfigured.
    from services.api.app import create_app

    log = get_logger(component="api")
    if settings.loopback_only:
        log.warning("no API tokens configured: listening on loopback only", host=settings.api_host)
    elif settings.api_allow_unauthenticated_bind:
        log.warning(
            "no API tokens configured: ANYONE who reaches this address can control jobs",
            host=settings.api_host,
        )
    else:
        log.error(
            "no API tokens configured: refusing to listen beyond loopback; use a loopback "
            "UNICRON_API_HOST or set UNICRON_API_ALLOW_UNAUTHENTICATED_BIND=true",
            host=settings.api_host,
        )
        sys.exit(2)
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,  # keep the structlog setup instead of uvicorn's own formatters
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
