"""The control plane: :mod:`.service`'s ``ControlPlane`` is a small controller over one manager per concern
(docs/serving.md, "The control plane's managers"): :mod:`.admission` admits apps into the store
(``edgemux.cluster.store``, kept in ``cluster`` because the offline ``edgemux place --store`` opens it without
the serving stack, and reached through :mod:`.storethread`), :mod:`.reconciler` keeps each app's target beside
its actual and reconciles them, :mod:`.routes` keeps the keys and publishes routes to the gateways,
:mod:`.transitions` moves apps make-before-break, :mod:`.adaptation` and :mod:`.power` adapt and consolidate;
:mod:`.api` is its HTTP API, :mod:`.agentdriver` how it reaches agents and :mod:`.apiclient` the one client of
its HTTP API (CLI, engine, gateway, benchmarks)."""
