"""Prometheus series of QoS compliance, read at scrape time from each pool's last compliance report."""

from prometheus_client.core import GaugeMetricFamily

from core.metrics import timestamp
from sharing.models import QoSComplianceReport


class ComplianceCollector:
    """The last compliance check of each pool: pods checked, violations, kubelet mismatches, when."""

    def collect(self):
        labels = ["cluster", "pool"]
        compliant = GaugeMetricFamily(
            "tessera_qos_compliant",
            "1 if the pool's pods and kubelets met its QoS policy at the last check, else 0.",
            labels=labels,
        )
        violations = GaugeMetricFamily(
            "tessera_qos_violations", "Pods breaking the pool's QoS policy at the last check.", labels=labels
        )
        mismatches = GaugeMetricFamily(
            "tessera_qos_kubelet_mismatches",
            "Kubelet settings that differ from what the pool's QoS policy expects, at the last check.",
            labels=labels,
        )
        pods = GaugeMetricFamily("tessera_qos_pods_checked", "Pods the last check looked at.", labels=labels)
        checked = GaugeMetricFamily(
            "tessera_qos_checked_timestamp_seconds", "When the pool was last checked.", labels=labels
        )
        for report in (
            QoSComplianceReport.objects.filter(policy__isnull=False)
            .select_related("pool__cluster")
            .only(
                "pool__name",
                "pool__cluster__name",
                "checked_at",
                "pods_checked",
                "violation_count",
                "kubelet_mismatches",
            )
        ):
            key = [report.pool.cluster.name, report.pool.name]
            mismatch_count = len(report.kubelet_mismatches or [])
            compliant.add_metric(key, 1 if not report.violation_count and not mismatch_count else 0)
            violations.add_metric(key, report.violation_count)
            mismatches.add_metric(key, mismatch_count)
            pods.add_metric(key, report.pods_checked)
            checked.add_metric(key, timestamp(report.checked_at))
        yield from (compliant, violations, mismatches, pods, checked)
