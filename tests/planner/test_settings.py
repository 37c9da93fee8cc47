"""The planner's settings: refused with a clear error when wrong, and what they build."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from unicron.planning.clusters import CLUSTERS
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.contracts.plans import Fairness

from tests.planning.defaults import default_objective


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"tenant_quotas": "{team-a: 8"}, "UNICRON_TENANT_QUOTAS is not valid JSON"),
        ({"tenant_quotas": '{"team-a": -8}'}, "'team-a': quota must be ≥ 0 slots, not -8"),
        ({"tenant_quotas": '{"team-a": 8.5}'}, "quota must be a whole number of slots"),
        ({"tenant_quotas": '["team-a"]'}, "must be a JSON object"),
        ({"tenant_quotas": '{"a b": 8}'}, "'a b' is not a tenant name"),
        ({"tenant_quotas": '{"team-a": 12}', "planner_cluster": "a100"},
         "12 slots is not a multiple of the 8 slots"),
        ({"planner_fairness": "fair"}, "'waf', 'aging' or 'guaranteed_min'"),
        ({"planner_aging_s": "0"}, "greater than 0"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_with_a_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PlannerSettings(**env)  # type: ignore[arg-type]


def test_the_settings_build_the_rules() -> None:
    settings = PlannerSettings(
        planner_fairness=Fairness.AGING,
        planner_aging_s=7200.0,
        tenant_quotas='{"team-a": 16, "*": 8}',
        planner_cluster="a100",
    )
    rules = settings.rules()
    assert rules.fairness == Fairness.AGING and rules.aging_s == 7200.0
    assert rules.quotas.of("team-a") == 16 and rules.quotas.of("team-z") == 8
    assert rules.quotas.of(None) is None


@pytest.mark.parametrize("cluster", ["cpu", "a100"])
def test_the_default_settings_build_the_objective_the_model_tests_use(cluster: str) -> None:
    settings = PlannerSettings(planner_cluster=cluster)
    assert settings.objective() == default_objective(CLUSTERS.get(cluster))
