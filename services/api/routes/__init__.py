"""One router per resource; :func:`unicron.services.api.app.create_app` mounts them."""
