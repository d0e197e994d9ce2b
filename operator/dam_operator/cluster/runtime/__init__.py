"""Runtime: what schedules and writes. ``main`` (the composition root of ``dam operator``), the
kopf handlers (thin), the scheduler, the pod webhook's server and its life cycle, readiness, the
operator's own metrics and the heap trimmer. Uses ``steps`` and ``adapters``."""
