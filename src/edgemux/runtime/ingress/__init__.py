"""Ingress: how a request reaches an agent. :mod:`.dispatch` is the sans-I/O core (policing, route table,
attempts and failover, the verdict on an answer) that both the threaded Python :mod:`.client` and the
asynchronous :mod:`.gateway` drive; :mod:`.routing` holds the published route of an app and the weighted
router; :mod:`.policing` the token bucket."""
