"""Tools that drive the runtime from outside: the open-loop load generator (:mod:`.load`) and the profiler
that measures models on a real backend (:mod:`.profiler`)."""
