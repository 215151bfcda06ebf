"""Building and running the service: scenario + state directory + tokens -> a running app.

:func:`build` is what ``fabricpilot serve`` and the tests use; :func:`serve` runs it under
uvicorn with JSON logs on stderr.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from fastapi import FastAPI

from fabricpilot.errors import FabricpilotError
from fabricpilot.runner import prepare
from fabricpilot.scenario.models import Scenario
from fabricpilot.service.app import DEFAULT_MAX_BODY_BYTES, JsonFormatter, create_app
from fabricpilot.service.auth import Principal, TokenRegistry, new_token
from fabricpilot.service.state import FabricService
from fabricpilot.service.store import Store

DB_NAME = "fabricpilot.db"
OPERATOR_TOKEN_FILE = "operator.token"


class ServeError(FabricpilotError):
    """The service cannot start (one line: what, where)."""


def operator_token(state_dir: Path) -> tuple[str, Path]:
    """The operator token of a state directory without a token file: read from
    ``operator.token``, created (mode 0600) on first start."""
    path = state_dir / OPERATOR_TOKEN_FILE
    if path.exists():
        token = path.read_text().strip()
        if len(token) < 16:
            raise ServeError(f"{path}: token too short (>= 16 characters)")
        return token, path
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, path


def build(scenario: Scenario, source: str, state_dir: Path, *, tokens: TokenRegistry | None,
          twin: bool = True, time_scale: float = 1e-3, tick_interval_s: float = 0.2,
          plan_interval_s: float = 0.25, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          ) -> tuple[FastAPI, FabricService, TokenRegistry, Path | None]:
    """The app over a fresh service whose durable state lives in ``state_dir`` (restored if
    it holds a database). Without ``tokens`` the state directory's operator token is used;
    its file is returned."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ServeError(f"{state_dir}: cannot create the state directory: "
                         f"{err.strerror}") from None
    token_file = None
    if tokens is None:
        token, token_file = operator_token(state_dir)
        tokens = TokenRegistry()
        tokens.add(token, Principal("operator", "operator"))
    prep = prepare(scenario, source)
    try:
        store = Store(state_dir / DB_NAME)
    except Exception as err:  # sqlite3.Error: a corrupt or foreign file
        raise ServeError(f"{state_dir / DB_NAME}: cannot open the database: {err}") from None
    service = FabricService(prep, store, twin=twin, time_scale=time_scale,
                            tick_interval_s=tick_interval_s, plan_interval_s=plan_interval_s)
    app = create_app(service, tokens, max_body_bytes=max_body_bytes)
    return app, service, tokens, token_file


def configure_logging(level: str = "INFO") -> None:
    """JSON lines on stderr for the service's loggers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("fabricpilot.service", "fabricpilot.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level)
        lg.propagate = False
