"""Re-planning shares on a spatial device as load moves: the transition kind, reclamation to fewer instances,
and the cluster simulator carrying a re-share out with the old instances serving until the new ones load."""

from __future__ import annotations

import math

from edgemux.adapt.plan import transition_kind
from edgemux.adapt.settings import AdaptSettings
from edgemux.cluster.state import App, Cluster, Device, Node, Placement, Share, Slo
from edgemux.cluster.workload import Discipline
from edgemux.policies.registry import get
from edgemux.profiles.types import DeviceKind
from edgemux.sim.cluster import Arrive, Rate, simulate_cluster
from edgemux.sim.devices import SpatialStation
from edgemux.sim.engine import Engine

PROFILE = "dhakal-v100/mobilenet"   # 1.023 ms alone with the whole V100, knee at 15 % (papers/002 line 88)
GPU = Device("n1", "gpu0", DeviceKind.GPU_DISCRETE, Discipline.SPATIAL, memory_mb=16384.0,
             profile_set="dhakal-v100")
CLUSTER = Cluster((Node("n1", 8.0, 16384.0, (GPU,)),))


def test_transition_kind_reshared():
    one = Placement("a", (Share("n1/gpu0", 1.0, PROFILE, 0.15, 1),))
    two = Placement("a", (Share("n1/gpu0", 1.0, PROFILE, 0.15, 2),))
    assert transition_kind(one, two) == "reshared"
    assert transition_kind(one, one) == "contract"
    elsewhere = Placement("a", (Share("n2/gpu0", 1.0, PROFILE, 0.15, 2),))
    assert transition_kind(one, elsewhere) == "moved"


def test_station_set_instances_grows_at_once_and_shrinks_as_requests_finish():
    eng, done = Engine(), {}
    st = SpatialStation(eng, lambda now, r: done.__setitem__(r, now), [10.0] * 6, [0] * 6, [1])
    for i in range(4):
        eng.schedule(0.0, 0, st.arrive, i)
    eng.schedule(5.0, 1, lambda now, _: st.set_instances(0, 3), 0)   # two more instances at 5 ms
    eng.schedule(12.0, 1, lambda now, _: st.set_instances(0, 1), 0)  # back to one at 12 ms
    for i in (4, 5):
        eng.schedule(13.0, 0, st.arrive, i)
    eng.run()
    # 0 runs 0-10; 1 and 2 start on the new instances at 5; 3 waits for 0's instance (10-20); after the
    # shrink only one instance takes new work: 4 waits for 3 (20-30), 5 for 4 (30-40)
    assert done == {0: 10.0, 1: 15.0, 2: 15.0, 3: 20.0, 4: 30.0, 5: 40.0}


def test_rate_up_reshares_in_place_and_rate_down_gives_the_share_back():
    """An app on a spatial V100 at 500 req/s runs one instance at the knee. It then sends 1500 req/s: the
    Ibis rule re-admits it at its observed rate, which Multi-Model answers with more instances on the same
    device (a re-share, nothing moved). When the rate falls back, reclamation re-plans it to one instance."""
    app = App("cam", "mobilenet", 500.0, Slo(5.0, "mean"))
    settings = AdaptSettings(window_s=1.0, trigger_windows=2, min_dwell_s=4.0)
    trace = [Arrive(0.0, app), Rate(5.0, "cam", 1500.0), Rate(20.0, "cam", 500.0)]
    run = simulate_cluster(CLUSTER, get("edgemux"), trace, horizon_s=40.0, seed=1, settings=settings,
                           model_load_s=0.5)
    kinds = [(a.kind, a.reason) for a in run.actions]
    assert kinds[0] == ("reshared", "over-contract"), kinds
    assert ("reshared", "under-contract") in kinds, kinds
    assert all(a.to_devices == ("n1/gpu0",) for a in run.actions)
    up = run.actions[0]
    assert math.isclose(up.serve_s - up.time_s, 0.5)
    rows = run.rows("cam")
    # every window after the first re-share has served, and late windows meet the 5 ms mean again
    late = [r for r in rows if r.start_s >= 30.0]
    assert late and all(r.mean_ms is not None and r.mean_ms <= 5.0 for r in late)
    assert run.total("cam").answered > 0
