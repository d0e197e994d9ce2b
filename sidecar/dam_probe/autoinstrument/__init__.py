"""Holds ``sitecustomize.py``: automatic DataLoader instrumentation for any Python on PYTHONPATH.

Not imported by anything: ``dam_probe.bootstrap.install_into`` copies the file
next to a copy of ``dam_probe``, and ``PYTHONPATH`` points there.
"""
