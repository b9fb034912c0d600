"""Adaptation after placement, as pure decisions: what was observed (``monitor``), what is wrong
(``detect``), what to do about it (``plan``), and when not to act yet (``damping``); ``loop.step`` runs them
in that order. Nothing here does I/O or reads a clock: the caller passes the time and the observations, so
the simulator (virtual time) and the control plane (real time) run the same code. See docs/adapt.md.
"""
