"""The ``unicron`` command line: client commands over the REST API, and the local stack."""
