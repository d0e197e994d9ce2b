"""Pure steps: no I/O, no clock, no kopf. The window step (``window_step``: snapshots and pods in,
status patch and Events out), the DAMProfile spec models, the status builders, the injection
builders, the actions policy, the goodput ledger, the URL policy, the in-memory pod and profile
index (``registry``: fed and read by ``runtime``, its records read by the steps), the operator's
metric names and what a failed fetch says (``source_error``). They use neither ``adapters`` nor
``runtime``."""
