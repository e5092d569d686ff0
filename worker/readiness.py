"""The worker's checks for /readyz (core.health): each Kubernetes cluster's watch, and beat's reconcile tick."""

from django.conf import settings
from django.utils import timezone

from core.health import Check
from core.metrics import age_seconds
from fleet.choices import ClusterDriver
from fleet.models import Cluster
from worker.metrics import WATCH_HEARTBEAT_STALE_SECONDS, watch_is_up
from worker.models import ClusterWatch, LoopRun
from worker.telemetry import RECONCILE_LOOP


def watch_checks() -> list[Check]:
    """One check per Kubernetes cluster, named `watch:<cluster>`."""
    now = timezone.now()
    watches = {w.cluster_id: w for w in ClusterWatch.objects.all()}
    checks = []
    for pk, name in Cluster.objects.filter(driver=ClusterDriver.KUBERNETES).values_list("pk", "name"):
        watch = watches.get(pk)
        if watch is None:
            detail = "never watched: is `manage.py watch_clusters` running?"
        elif watch_is_up(watch, now):
            detail = f"connected for {age_seconds(watch.since, now):.0f} s"
        elif watch.connected:
            detail = (
                f"no heartbeat for {age_seconds(watch.heartbeat_at, now):.0f} s "
                f"(more than {WATCH_HEARTBEAT_STALE_SECONDS} s): the watcher stopped or hangs"
            )
        else:
            detail = f"disconnected for {age_seconds(watch.since, now):.0f} s: {watch.error or 'no error recorded'}"
        checks.append(Check(f"watch:{name}", watch_is_up(watch, now), detail))
    return checks


def beat_checks() -> list[Check]:
    """Beat sends the reconcile tick every TESSERA_RECONCILE_SECONDS; three periods without one is a stopped beat (or
    no worker to run it)."""
    period = float(settings.CELERY_BEAT_SCHEDULE["reconcile-tick"]["schedule"])
    run = LoopRun.objects.filter(name=RECONCILE_LOOP).first()
    if run is None or run.last_started_at is None:
        return [Check("beat", False, "no reconcile tick has run yet: are beat and a worker running?")]
    age = age_seconds(run.last_started_at, timezone.now())
    ok = age <= 3 * period
    detail = f"last reconcile tick {age:.0f} s ago (every {period:g} s)"
    if run.last_error:
        detail += f"; it failed: {run.last_error[:200]}"
    return [Check("beat", ok, detail if ok else detail + ": is beat running, and a worker to run its ticks?")]
