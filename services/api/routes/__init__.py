"""One router per resource; :func:`services.api.app.create_app` mounts them."""
