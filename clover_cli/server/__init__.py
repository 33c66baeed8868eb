"""The HTTP server behind `clover serve`: OpenAI-compatible API, native routes and the web page."""

from .app import create_app
from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
