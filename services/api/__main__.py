"""Entry point: ``python -m unicron.services.api`` serves the API with uvicorn."""

from __future__ import annotations

import sys

import uvicorn
from pydantic import ValidationError
from unicron.services.api.settings import ApiSettings
from unicron.shared.logging import configure_logging, get_logger


def load_settings() -> ApiSettings:
    """The settings, or exit 2 with errors that never echo a token (pydantic's own message
    repeats the input, and a token is a key of ``api_tokens``)."""
    try:
        return ApiSettings()
    except ValidationError as exc:
        for error in exc.errors(include_input=False, include_url=False):
            loc = [str(part) for part in error["loc"]]
            if loc[:1] == ["api_tokens"] and len(loc) > 1:
                loc[1] = "<token>"
            variable = "UNICRON_" + loc[0].upper()
            print(
                f"invalid setting {variable} {'.'.join(loc[1:])}: {error['msg']}", file=sys.stderr
            )
        sys.exit(2)


def check_bind(settings: ApiSettings) -> None:
    """Without tokens anyone who reaches the API controls jobs: stay on loopback unless told."""
    log = get_logger(component="api")
    if settings.tokens_required:
        log.info("bearer tokens required on /v1", tokens=len(settings.api_tokens))
    elif settings.loopback_only:
        log.warning("no API tokens configured: listening on loopback only", host=settings.api_host)
    elif settings.api_allow_unauthenticated_bind:
        log.warning(
            "no API tokens configured: ANYONE who reaches this address can control jobs",
            host=settings.api_host,
        )
    else:
        log.error(
            "no API tokens configured: refusing to listen beyond loopback; set UNICRON_API_TOKENS, "
            "use a loopback UNICRON_API_HOST or set UNICRON_API_ALLOW_UNAUTHENTICATED_BIND=true",
            host=settings.api_host,
        )
        sys.exit(2)


def main() -> None:
    settings = load_settings()
    configure_logging("api", settings.log_level, settings.log_format)
    # Imported only now: unicron.shared.logging.get_logger binds the configuration in force when a
    # module-level logger is created, so modules imported earlier would log unconfigured.
    from unicron.services.api.app import create_app

    check_bind(settings)
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,  # keep the structlog setup instead of uvicorn's own formatters
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
