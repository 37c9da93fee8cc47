"""Who is calling, and what they may see and do (docs/design.md §6, Access).

With no tokens configured (the dev default) every caller is an admin of no tenant and every
call is allowed; the service then binds loopback only. With tokens configured every /v1 call
needs ``Authorization: Bearer <token>``: the token's grant gives the caller a role (admin,
user) and a tenant. Admins see and control everything; a user sees and controls only the jobs
its tenant submitted, and gets 404 for any other, so ids of other tenants' jobs leak nothing.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from unicron.services.api.deps import SettingsDep
from unicron.services.api.settings import Role, TokenGrant
from unicron.shared.contracts.models import JobBase
from unicron.shared.logging import get_logger

log = get_logger(component="api.access")
# auto_error=False: a missing or non-bearer header must give our 401 with WWW-Authenticate,
# and in open mode no header at all is fine. The scheme also documents the API in OpenAPI.
bearer = HTTPBearer(auto_error=False, description="an API token from UNICRON_API_TOKENS")
CHALLENGE = 'Bearer realm="unicron"'


@dataclass(frozen=True)
class Caller:
    """The principal of one request; ``tenant`` is None only when no tokens are configured."""

    role: Role
    tenant: str | None

    @property
    def admin(self) -> bool:
        return self.role == "admin"


OPEN = Caller(role="admin", tenant=None)


def grant_for(token: str, tokens: dict[str, TokenGrant]) -> TokenGrant | None:
    """The grant of ``token``. Every configured token is compared in constant time, and the
    loop never stops early, so response timing tells nothing about how close a guess was."""
    presented = token.encode()
    found = None
    for candidate, grant in tokens.items():
        if hmac.compare_digest(presented, candidate.encode()):
            found = grant
    return found


def authenticate(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    if not settings.tokens_required:
        return OPEN
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "this API needs a bearer token: send 'Authorization: Bearer <token>' "
            "(unicron --token, or UNICRON_API_TOKEN)",
            headers={"WWW-Authenticate": CHALLENGE},
        )
    grant = grant_for(credentials.credentials, settings.api_tokens)
    if grant is None:
        client = request.client.host if request.client else None
        log.warning("rejected an unknown API token", client=client, path=request.url.path)
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "the bearer token is not valid",
            headers={"WWW-Authenticate": f'{CHALLENGE}, error="invalid_token"'},
        )
    return Caller(role=grant.role, tenant=grant.tenant)


def require_admin(caller: Annotated[Caller, Depends(authenticate)]) -> Caller:
    if not caller.admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"this call needs an admin token; yours has role {caller.role!r} "
            f"(tenant {caller.tenant!r})",
        )
    return caller


Principal = Annotated[Caller, Depends(authenticate)]
AdminPrincipal = Annotated[Caller, Depends(require_admin)]


def may_see(caller: Caller, job: JobBase) -> bool:
    """Tenant scoping in one place. A job submitted without tokens has no tenant: once tokens
    are configured only admins see it."""
    return caller.admin or job.tenant == caller.tenant
