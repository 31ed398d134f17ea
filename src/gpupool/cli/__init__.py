"""The ``gpupool`` command (typer + rich). Sub-commands live in sibling modules."""

from gpupool.cli.main import app, main

__all__ = ["app", "main"]
