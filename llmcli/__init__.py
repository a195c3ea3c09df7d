"""llmcli: run large language models locally, quantized, from the command line."""

__version__ = "0.1.0"
