"""The sidecar's collectors, one per source (see ``dam_sidecar.collectors.base``).

- ``ProbeCollector`` (``probe``): the probe files: steps, waits, collectives, goodput, ranks;
- ``GpuCollector`` (``nvml``): NVML, with the GPU attribution;
- ``HostCollector`` (``cpu``): host CPU and memory of the training processes, the container's cgroup;
- ``HealthCollector``: the sidecar's own health (sampler errors and durations, the timestamp).

``dam_sidecar.collector.standard_collectors`` builds the list in its order;
``dam_sidecar.collector.SidecarCollector`` samples them on one tick and serves the result.
"""
