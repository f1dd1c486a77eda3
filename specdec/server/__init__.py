"""OpenAI-compatible HTTP server over the async engine (needs the `serve` extra: fastapi, uvicorn,
prometheus-client)."""

from specdec.server.app import OpenAIServer, create_app

__all__ = ["OpenAIServer", "create_app"]
