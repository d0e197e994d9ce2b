"""dam_operator: the diagnosis engine, the Kubernetes operator and the ``dam`` command line."""
