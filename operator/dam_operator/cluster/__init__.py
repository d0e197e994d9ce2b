"""The cluster side, in three roles (import-linter keeps them one way: runtime -> adapters -> steps):
``steps/`` pure (the window step, spec models, status and injection builders, the actions policy,
the goodput ledger, the URL policy, the pod and profile index, the operator's metric names),
``adapters/`` the I/O edges (the Kubernetes API, the pod watch, metric sources, certificates) and
``runtime/`` what schedules and writes (kopf handlers (thin), the scheduler, the webhook server,
readiness, the operator's metrics). ``settings.py`` is the one settings object all three read;
``runtime/main.py`` is the composition root of ``dam operator``."""
