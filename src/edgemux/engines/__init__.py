"""Engines: where edgemux's processes run. :mod:`.local` starts the control plane, a gateway and one agent
per node as processes of this machine (``edgemux up``, ``edgemux demo``); a distributed engine is a sibling
module with the same contract."""
