"""The Prometheus registry served at /metrics; each app registers its collectors in AppConfig.ready()."""

from prometheus_client import CollectorRegistry

REGISTRY = CollectorRegistry(auto_describe=False)
