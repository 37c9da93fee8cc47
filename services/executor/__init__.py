"""The executor: turns plans into transitions carried out through the node agents."""
