"""Prometheus series of schedules: when each one's latest transition came due and when its next one is."""

from prometheus_client.core import GaugeMetricFamily

from core.metrics import once_per_scrape, timestamp
from scheduling.selectors import TRANSITIONS_AROUND_NOW, transitions_around


class ScheduleCollector:
    """The transitions of enabled schedules around now (a week either side)."""

    def collect(self):
        labels = ["cluster", "pool", "schedule"]
        due = GaugeMetricFamily(
            "tessera_schedule_last_transition_timestamp_seconds",
            "When the schedule's latest transition came due (its pool's desired profile or QoS policy switched).",
            labels=labels,
        )
        upcoming = GaugeMetricFamily(
            "tessera_schedule_next_transition_timestamp_seconds",
            "When the schedule's next transition is due.",
            labels=labels,
        )
        for schedule, (last, following) in once_per_scrape(TRANSITIONS_AROUND_NOW, transitions_around).items():
            key = [schedule.pool.cluster.name, schedule.pool.name, schedule.name]
            if last is not None:
                due.add_metric(key, timestamp(last.at))
            if following is not None:
                upcoming.add_metric(key, timestamp(following.at))
        yield from (due, upcoming)
