"""Serving runtime: model zoo, backends, agents, client."""
