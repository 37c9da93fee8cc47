"""Nodes: the cluster's nodes as their agents registered them."""

from __future__ import annotations

from fastapi import APIRouter

from unicron.services.api.deps import StateDep
from unicron.shared.models import NodeRecord

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


@router.get("", response_model=list[NodeRecord])
async def list_nodes(state: StateDep) -> list[NodeRecord]:
    return await state.list_nodes()
