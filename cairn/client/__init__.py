"""The clients a web app, a script or a test uses: enqueue runs, wait for them, read them,
signal, cancel, fork and replay them, and follow their events (cairn.client.events)."""

from cairn.client.aio import AsyncClient
from cairn.client.client import Client

__all__ = ["AsyncClient", "Client"]
