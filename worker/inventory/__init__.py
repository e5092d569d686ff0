"""Inventory from Kubernetes: nodes (list + watch), GPUs and MIG devices (dcgm-exporter), GPU pods, cluster health.

Nodes come from the API's Node objects and GPU Feature Discovery labels (contracts §3.6); GFD publishes no GPU
UUIDs, so GPUs come from dcgm-exporter's series (§10), joined on the node + gpu + UUID. Everything is
recorded through the fleet services (bulk, idempotent): a repeated sync writes nothing.

HTTP never runs inside a database transaction; the watch batches events (up to `watch.BATCH_SECONDS`) so a burst
of changes costs one recording whose size is the number of changed nodes.

Modules: `nodes` (Node objects → observations), `dcgm` (exporter series → GPUs, MIG devices, metrics),
`exporters` (where the series are read: Prometheus, a central endpoint, or each exporter pod), `pods` (GPU
pods), `cluster` (whole-cluster passes: full listing, metrics scrape, health check), `watch` (the node watch).
"""
