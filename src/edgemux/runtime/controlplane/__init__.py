"""The control plane: :mod:`.service` admits apps into the store (``edgemux.cluster.store``, kept in
``cluster`` because the offline ``edgemux place --store`` opens it without the serving stack), reconciles what
should run with what runs, moves apps make-before-break and publishes routes; :mod:`.agentdriver` is how it
reaches agents; :mod:`.apiclient` is the one client of its HTTP API (CLI, engine, gateway, benchmarks)."""
