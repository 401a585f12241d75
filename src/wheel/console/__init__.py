"""The web console: one static page over a JSON API under ``/api/``, served
by the node (``wheelctl serve --http-listen HOST:PORT``).

A peer of ``wheel.rpc``: it reads and acts only through the node's gRPC
API (``wheel.client.AsyncClient``), with the browser's bearer token, so
auth, scopes and tenancy are the API's. Read-only unless started with
actions on (``--console-actions``).
"""

from wheel.console._app import Console
from wheel.console._server import ConsoleServer, parse_http_listen

__all__ = ["Console", "ConsoleServer", "parse_http_listen"]
