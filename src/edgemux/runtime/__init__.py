"""The serving runtime, one package per subsystem (docs/architecture.md, "The runtime's subsystems").

Lowest first; a subsystem imports only the shared modules and the subsystems before it
(tests/test_layers.py checks it):

* ``httpserver``, ``httputil``, ``grpcserver``, ``process``, ``messages``, ``tally``, ``loopmetrics``, ``policing``,
  ``auth``, ``tls``: shared by every service (the HTTP/1.1 server core, one way to write a server on it and its
  request bodies and JSON, a gRPC listener for the same handlers' logic, the event loop and allocator of a service process, how a typed message
  reads its JSON fields, the per-request counts an agent and a gateway report as their observations, Prometheus metrics written
  from one event loop without a lock, the
  thread-safe token bucket the gateway, the client and the agent police an app's contract with, and who may
  call: the admin token and the app keys, and TLS: listeners' certificates and a local CA).
* ``zoo``: ONNX models built in code.
* ``dataplane``: what executes inference on a node: the agent, its device workers, the backends, the Open
  Inference Protocol codec, pre-processing, and the agent's typed messages to and from the control plane.
* ``ingress``: how requests reach the agents: the gateway and the Python client over one sans-I/O core
  (policing, routing, failover), and the route an app is published with.
* ``controlplane``: a controller over one manager per concern (admission into the store, placement and its
  reconcile pass, routes and keys, make-before-break transitions, adaptation, power), the driver it reaches
  agents through, and the one client of its HTTP API.
* ``tools``: the load generator and the profiler.

Where the processes run is the engines layer above (``edgemux.engines``).
"""
