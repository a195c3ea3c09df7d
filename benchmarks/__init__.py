"""Benchmarks: scripts run as modules from the repository root (`python -m benchmarks.speed.busy_cpu --help`),
and `shapes`, the GGUF weights they and the tests make. See README.md here."""
