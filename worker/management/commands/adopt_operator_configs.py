"""`manage.py adopt_operator_configs <cluster>`: point a GPU Operator cluster's ClusterPolicy at Tessera's ConfigMaps
(docs/install.md, step 6).

Tessera writes each node's MIG and device-plugin configs into ConfigMaps of its own, which the ClusterPolicy must
name. This seeds them with every config the cluster's nodes select today and then re-points the policy
(worker.drivers.kubernetes.operator.Operator.adopt); when a node selects a config Tessera has no copy of, it
refuses and changes nothing. Running it again once adopted changes nothing. Audited as `cluster.adopt_configs`.
"""

from django.core.management.base import BaseCommand, CommandError

from core.audit import Actor, audit_record
from fleet.choices import ClusterDriver
from fleet.models import Cluster
from worker.drivers import driver_for
from worker.drivers.base import DriverError


class Command(BaseCommand):
    help = "Point a GPU Operator cluster's ClusterPolicy at Tessera's MIG and device-plugin ConfigMaps."

    def add_arguments(self, parser):
        parser.add_argument("cluster", help="the cluster's name in Tessera")

    def handle(self, *args, cluster: str, **options):
        target = Cluster.objects.filter(name=cluster, driver=ClusterDriver.KUBERNETES).first()
        if target is None:
            raise CommandError(f"no Kubernetes cluster named {cluster!r} in Tessera")
        try:
            lines = driver_for(target).adopt_operator_configs()
        except DriverError as exc:
            raise CommandError(str(exc)) from exc
        audit_record(
            actor=Actor.system("manage.py adopt_operator_configs"),
            action="cluster.adopt_configs",
            obj=target,
            message="; ".join(lines),
        )
        for line in lines:
            self.stdout.write(line)
