"""Imports every CLI module that adds commands to `llmcli.cli.app` (one line per module)."""
