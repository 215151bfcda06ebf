"""The controller as a service: REST API, auth, persistence, metrics and dashboard.

``fabricpilot serve`` runs :func:`~fabricpilot.service.app.create_app` under uvicorn. The
pieces, one job each: :mod:`~fabricpilot.service.schemas` (validated payloads),
:mod:`~fabricpilot.service.auth` (tokens and tenancy), :mod:`~fabricpilot.service.store`
(SQLite), :mod:`~fabricpilot.service.twin` (the data plane: the twin in scaled real time),
:mod:`~fabricpilot.service.state` (the controller service and its control loop),
:mod:`~fabricpilot.service.metrics` (Prometheus) and :mod:`~fabricpilot.service.app` (HTTP).
"""
