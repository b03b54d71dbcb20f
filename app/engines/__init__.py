"""Engines: things that turn prompt token ids into streamed output token ids."""
