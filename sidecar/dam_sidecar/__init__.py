"""The DAM sidecar: samplers (probe file, NVML, CPU) and the Prometheus exporter."""
