"""The REST API: job submission and control, cluster views, the event stream, health, metrics.

Run it with ``python -m services.api``; build one in-process with
:func:`services.api.app.create_app`.
"""
