"""The REST API: job submission and control, cluster views, the event stream, health, metrics.

Run it with ``python -m unicron.services.api``; build one in-process with
:func:`unicron.services.api.app.create_app`.
"""
