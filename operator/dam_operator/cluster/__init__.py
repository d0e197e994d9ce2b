"""The cluster side: kopf handlers (thin), the scheduler and window step, the pod webhook and
injection, certificates, the Kubernetes adapter, metric sources, status builders and the
operator's own metrics. `main.py` is the composition root of `dam operator`."""
