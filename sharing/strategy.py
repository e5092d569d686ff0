"""The strategy of a rollout an operator starts: one list of fields with their bounds, labels and defaults, read by
the UI's form (sharing.forms.RolloutStrategyForm) and the API's serializers (worker.api), so both offer the same
choices and start from the same values: TESSERA["ROLLOUT_DEFAULTS"], which the reconcile loop uses too."""

from dataclasses import dataclass

from django.conf import settings

from sharing.choices import BusyPolicy, FailurePolicy


@dataclass(frozen=True)
class StrategyField:
    name: str
    label: str
    help_text: str
    min_value: int | None = None
    max_value: int | None = None
    choices: tuple | None = None  # a choice field instead of a number


STRATEGY_FIELDS = (
    StrategyField("batch_size", "Batch size", "nodes changing at once", min_value=1, max_value=10_000),
    StrategyField("canary_count", "Canary nodes", "first, alone", min_value=0, max_value=10_000),
    StrategyField("max_failures", "Stop after failures", "failed nodes", min_value=1, max_value=10_000),
    StrategyField(
        "on_failure", "On a failed canary", "fail the rollout, or pause it", choices=tuple(FailurePolicy.choices)
    ),
    StrategyField("busy_policy", "Busy GPUs", "wait for idle GPUs, or drain", choices=tuple(BusyPolicy.choices)),
    StrategyField("wait_minutes", "Wait up to", "minutes, for idle GPUs or a drain", min_value=0, max_value=24 * 60),
    StrategyField("verify_timeout_seconds", "Verify within", "seconds, then the node counts as failed", 10, 24 * 3600),
)
STRATEGY_NAMES = tuple(f.name for f in STRATEGY_FIELDS)


def strategy_default(name: str):
    """The default of one strategy field, read when a form or request is made (settings may change in tests)."""
    return settings.TESSERA["ROLLOUT_DEFAULTS"][name]


def strategy_defaults() -> dict:
    return {name: strategy_default(name) for name in STRATEGY_NAMES}
