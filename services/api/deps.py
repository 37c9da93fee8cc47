"""Request dependencies: the connections and settings the lifespan put on ``app.state``.

Routes declare what they need with these ``Annotated`` aliases, so a route never reaches
for a global and tests can build as many independent apps as they like.
"""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request
from unicron.services.api.metrics import ApiMetrics
from unicron.services.api.settings import ApiSettings
from unicron.shared.bus.bus import Bus
from unicron.shared.store.state import StateStore


def get_bus(request: Request) -> Bus:
    return cast(Bus, request.app.state.bus)


def get_state(request: Request) -> StateStore:
    return cast(StateStore, request.app.state.store)


def get_settings(request: Request) -> ApiSettings:
    return cast(ApiSettings, request.app.state.settings)


def get_metrics(request: Request) -> ApiMetrics:
    return cast(ApiMetrics, request.app.state.metrics)


BusDep = Annotated[Bus, Depends(get_bus)]
StateDep = Annotated[StateStore, Depends(get_state)]
SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
MetricsDep = Annotated[ApiMetrics, Depends(get_metrics)]
