"""Import a Kubernetes cluster's own NVIDIA configs as sharing profiles: preview, then confirm.

The driver reads the ClusterPolicy, the ConfigMaps it names and the nodes' labels (read only: an import changes
nothing in the cluster); sharing.nvidia_import judges them as mig-parted and the device plugin would; sharing's
service creates the profiles. The confirmation reads the cluster again, so it creates what is true at that moment.
"""

from core.audit import Actor
from core.exceptions import ApplicationError
from fleet.choices import ClusterDriver
from fleet.models import Cluster
from sharing import services as sharing_services
from sharing.models import SharingProfile
from sharing.selectors import ImportPreview, nvidia_import_preview
from worker.drivers.base import DriverError
from worker.drivers.kubernetes import kubernetes_driver


def import_preview(cluster: Cluster) -> ImportPreview:
    """What importing the cluster's configs would create and refuse, per config name and per profile."""
    if cluster.driver != ClusterDriver.KUBERNETES:
        raise ApplicationError(
            f"Cluster {cluster.name} uses the {cluster.get_driver_display()} driver: only a GPU Operator's "
            "ConfigMaps can be imported."
        )
    try:
        configs = kubernetes_driver(cluster).nvidia_configs()
    except DriverError as exc:
        raise ApplicationError(f"Cannot read the GPU Operator's configs of {cluster.name}: {exc}", status=502) from None
    return nvidia_import_preview(cluster, configs)


def import_confirm(*, actor: Actor, cluster: Cluster, names: list[str] | None = None) -> list[SharingProfile]:
    """Create the previewed profiles (all that can be, or `names`) from a fresh read of the cluster."""
    return sharing_services.profiles_import(actor=actor, preview=import_preview(cluster), names=names)
