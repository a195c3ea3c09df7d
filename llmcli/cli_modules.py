"""Imports every CLI module that adds commands to `llmcli.cli.app` (one line per module)."""
from . import cli_models  # noqa: F401  pull, list, show, rm
from . import cli_chat  # noqa: F401  llmcli chat
from . import cli_quant  # noqa: E402,F401  quantize, perplexity
from . import cli_bench  # noqa: E402,F401  bench
from . import cli_batch  # noqa: E402,F401  batch
from . import cli_serve  # noqa: E402,F401  serve
