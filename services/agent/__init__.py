"""The node agent: one per node; registers the node, supervises its workers, relays reports."""
