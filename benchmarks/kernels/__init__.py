"""Kernels: one matrix product or one decode step per kernel, format or variant, in isolation."""
