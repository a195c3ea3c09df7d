"""Benchmarks: scripts run as modules from the repository root (`python -m benchmarks.speed.busy_cpu --help`),
and `shapes`, the GGUF weights they make (its pieces beside it; gguf_blocks and gpt_oss_mxfp4 the tests
use too). See README.md here."""
