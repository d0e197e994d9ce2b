"""Adapters: the cluster side's I/O edges. The Kubernetes API (``kube``: status patches, Events,
the webhook's Secret and configuration), the pods' list-then-watch (``podwatch``), where a pod's
counters are read (``sources``: direct scrape, the Prometheus HTTP API) and the webhook's TLS
certificates (``certs``). They may use ``steps``, never ``runtime``."""
