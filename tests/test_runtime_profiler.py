"""The profiler: statistics from an injected timer (exact), real measurements (sane), the profile set it writes
(loads, carries its provenance, round-trips), the combined catalog, and ``edgemux profile`` / ``--profiles``
on the command line, every bad input being one line and exit code 2. No wall-clock thresholds."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from edgemux.cli.main import main
from edgemux.errors import InputError
from edgemux.profiles import catalog as catalog_mod
from edgemux.profiles.catalog import (
    CatalogDataError,
    active_profile_sets,
    load_builtin_catalog,
    load_catalog,
    load_catalog_from,
    use_profile_sets,
)
from edgemux.profiles.types import DeviceKind
from edgemux.runtime.tools import profiler
from edgemux.runtime.dataplane.backends import OnnxRuntimeBackend, ModelSource
from edgemux.runtime.tools.profiler import (
    HostInfo,
    Measurement,
    ProfilerError,
    cpu_model,
    host_info,
    profile_models,
    provenance_text,
    write_profile_set,
)

SIZE = 64  # squeezenet1_1 at 64x64: a real network that runs in well under a millisecond or so
HOST = HostInfo(backend="onnxruntime", version="1.2.3", providers=("CPUExecutionProvider",), threads=2,
                node="node-a", cpu_model="Some CPU 9000", date="2026-01-02T03:04:05Z")
HOST_TEXT = ("measured with onnxruntime 1.2.3 (CPUExecutionProvider, 2 threads) on node-a / Some CPU 9000 at "
             "2026-01-02T03:04:05Z, 2 warm-up + 5 timed runs per batch")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def source(cache: Path) -> ModelSource:
    return ModelSource(zoo="squeezenet1_1", input_size=SIZE, cache_dir=str(cache))


@pytest.fixture(scope="module")
def measured(source: ModelSource) -> list[Measurement]:
    """Real measurements, taken once for the module: batches 1 and 2, 2 warm-up + 5 timed runs."""
    return profile_models(OnnxRuntimeBackend(1), [source], [1, 2], 2, 5)


class FakeTimer:
    """A clock (seconds) that advances by the next duration between a start and an end call."""

    def __init__(self, durations_s: list[float]) -> None:
        self.durations = list(durations_s)
        self.now = 100.0
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:  # an end call: the timed run took the next duration
            self.now += self.durations.pop(0)
        return self.now


# ------------------------------------------------------------------------------------------ measuring


def test_fake_timer_gives_exactly_the_fake_durations(source: ModelSource) -> None:
    # binary-exact seconds, so the ms values and their statistics are exact too
    b1 = [0.25, 0.5, 0.125, 1.0, 0.75]
    b2 = [2.0, 1.5, 1.75, 2.5, 1.25]
    timer = FakeTimer(b1 + b2)
    backend = OnnxRuntimeBackend(1)
    ms = profile_models(backend, [source], [2, 1, 2], 2, 5, timer=timer)  # unsorted and repeated on purpose
    assert timer.calls == 2 * 5 * 2  # two calls per timed run, none during the warm-up runs
    assert [(m.model, m.batch, m.variant) for m in ms] == [
        ("squeezenet1_1", 1, "64x64-b1"), ("squeezenet1_1", 2, "64x64-b2")]
    for m, durations in zip(ms, (b1, b2)):
        expect = np.array(durations) * 1000.0
        assert m.samples_ms == tuple(expect)
        assert m.mean_ms == float(expect.mean())
        assert m.var_ms2 == float(expect.var(ddof=1))
        assert m.p50_ms == float(np.median(expect))
        assert m.p95_ms == float(np.percentile(expect, 95))
        assert (m.min_ms, m.max_ms) == (float(expect.min()), float(expect.max()))
        assert m.cv == pytest.approx(math.sqrt(m.var_ms2) / m.mean_ms)
        assert m.per_item_ms == m.mean_ms / m.batch
        assert (m.warmup, m.repeats, m.source) == (2, 5, f"zoo:squeezenet1_1@{SIZE}x{SIZE}")
    assert ms[0].samples_ms == (250.0, 500.0, 125.0, 1000.0, 750.0)
    assert ms[0].mean_ms == 525.0 and ms[0].p50_ms == 500.0 and ms[0].min_ms == 125.0
    assert backend.loaded() == {}  # the profiler unloads what it loaded


def test_real_timer_gives_sane_numbers(measured: list[Measurement], source: ModelSource) -> None:
    assert [m.batch for m in measured] == [1, 2]
    weights_mb = source.onnx_path().stat().st_size / 1e6
    for m in measured:
        assert len(m.samples_ms) == 5
        assert all(math.isfinite(x) and x > 0 for x in m.samples_ms)
        assert m.min_ms <= m.p50_ms <= m.max_ms and m.min_ms <= m.mean_ms <= m.max_ms <= m.max_ms
        assert m.p95_ms <= m.max_ms and m.var_ms2 >= 0 and math.isfinite(m.cv)
        assert m.memory_static_mb == weights_mb > 0


def test_statistics_edge_cases() -> None:
    one = Measurement.from_samples("m", "zoo:m", None, 1, 0, [3.0])
    assert (one.mean_ms, one.var_ms2, one.p95_ms, one.cv, one.variant) == (3.0, 0.0, 3.0, 0.0, "b1")
    for bad in ([], [1.0, float("nan")], [-1.0], [float("inf")]):
        with pytest.raises(ProfilerError):
            Measurement.from_samples("m", "zoo:m", None, 1, 0, bad)


def test_profile_models_rejects_bad_arguments(source: ModelSource) -> None:
    backend = OnnxRuntimeBackend(1)
    for batches, warmup, repeats in (([], 1, 1), ([0], 1, 1), ([1], -1, 1), ([1], 1, 0), ([True], 1, 1)):
        with pytest.raises(ProfilerError):
            profile_models(backend, [source], batches, warmup, repeats)


def test_fixed_batch_model_cannot_be_profiled_at_another_batch(cache: Path) -> None:
    from edgemux.runtime import zoo
    from edgemux.runtime.dataplane.backends import BackendError

    path = zoo.path("squeezenet1_1", input_size=SIZE, batch=1, cache_dir=cache)
    backend = OnnxRuntimeBackend(1)
    (m,) = profile_models(backend, [ModelSource(path=str(path))], [1], 0, 1, timer=FakeTimer([0.5]))
    assert m.model == path.stem and m.variant == f"{SIZE}x{SIZE}-b1"  # size read from the graph
    with pytest.raises(BackendError, match="fixed batch dimension 1"):
        profile_models(backend, [ModelSource(path=str(path))], [2], 0, 1)
    assert backend.loaded() == {}


# ------------------------------------------------------------------------------------------ provenance


def test_provenance_format() -> None:
    assert provenance_text(HOST, 2, 5) == HOST_TEXT
    no_cpu = HostInfo(**{**HOST.as_dict(), "providers": ("CPUExecutionProvider",), "cpu_model": None})
    assert " on node-a at 2026-01-02T03:04:05Z, " in provenance_text(no_cpu, 2, 5)


def test_host_info_reads_this_host(tmp_path: Path) -> None:
    import onnxruntime as ort

    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Fancy  CPU @ 3GHz\n\nprocessor\t: 1\n")
    when = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)
    h = host_info(OnnxRuntimeBackend(3), now=when, cpuinfo=fake)
    assert (h.backend, h.version, h.providers, h.threads) == ("onnxruntime", ort.__version__,
                                                             ("CPUExecutionProvider",), 3)
    assert h.cpu_model == "Fancy CPU @ 3GHz" and h.date == "2026-05-06T07:08:09Z" and h.node
    text = provenance_text(h, 5, 30)
    assert re.fullmatch(rf"measured with onnxruntime {re.escape(ort.__version__)} \(CPUExecutionProvider, "
                        rf"3 threads\) on .+ / Fancy CPU @ 3GHz at 2026-05-06T07:08:09Z, "
                        rf"5 warm-up \+ 30 timed runs per batch", text)
    assert host_info(OnnxRuntimeBackend(1), cpuinfo=tmp_path / "absent").cpu_model is None


def test_cpu_model_on_other_machines(tmp_path: Path) -> None:
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 38.40\n\nHardware\t: BCM2835\nModel\t: Raspberry Pi 4\n")
    assert cpu_model(arm) == "BCM2835"
    bare = tmp_path / "bare"
    bare.write_text("processor\t: 0\nprocessor\t: 1\n")
    assert cpu_model(bare) is None


# -------------------------------------------------------------------------------------- the profile set


def test_written_set_loads_with_provenance_and_round_trips(measured: list[Measurement], tmp_path: Path) -> None:
    out = write_profile_set(measured, tmp_path / "set", "cpu-test", "cpu", HOST)
    assert sorted(p.name for p in out.iterdir()) == ["catalogs.yaml", "constants.yaml", "cpu-test.csv"]
    cat = load_catalog_from(out)
    assert cat.catalogs() == ["cpu-test"] and cat.info("cpu-test").device_kind is DeviceKind.CPU
    assert list(cat.profiles) == ["cpu-test/squeezenet1_1:64x64-b1", "cpu-test/squeezenet1_1:64x64-b2"]
    for m in measured:
        p = cat.get(f"cpu-test/squeezenet1_1:{m.variant}")
        assert p.device_kind is DeviceKind.CPU and p.model == "squeezenet1_1"
        assert p.provenance.source == provenance_text(HOST, 2, 5) == HOST_TEXT
        assert f"batch {m.batch}" in p.provenance.detail
        # exact round trip: the CSV holds repr() of every float
        assert list(p.exec) == [m.batch]
        assert p.exec[m.batch].mean_ms == m.mean_ms and p.exec[m.batch].var_ms2 == m.var_ms2
        assert p.memory_static_mb == m.memory_static_mb
        assert p.extra["exec_p95_ms"] == m.p95_ms and p.extra["exec_p50_ms"] == m.p50_ms
        assert (p.extra["exec_min_ms"], p.extra["exec_max_ms"]) == (m.min_ms, m.max_ms)
        assert p.extra["exec_cv"] == m.cv and p.extra["timed_runs"] == 5 and p.extra["warmup_runs"] == 2
        assert p.extra["model_source"] == m.source
    # Catalog.find picks the batch-1 variant: the service time of one request
    assert cat.find("squeezenet1_1", "cpu").exec[1].mean_ms == measured[0].mean_ms
    assert cat.find("SqueezeNet-1.1", DeviceKind.CPU).variant == "64x64-b1"


def test_write_refuses_bad_requests(measured: list[Measurement], tmp_path: Path) -> None:
    with pytest.raises(ProfilerError, match="built-in"):
        write_profile_set(measured, tmp_path / "a", "ibis-edgetpu", "cpu", HOST)
    with pytest.raises(ProfilerError, match="lower-case"):
        write_profile_set(measured, tmp_path / "a", "Bad_Name", "cpu", HOST)
    with pytest.raises(ProfilerError, match="provenance"):
        write_profile_set(measured, tmp_path / "a", "cpu-x", "cpu", None)
    with pytest.raises(ProfilerError, match="no measurements"):
        write_profile_set([], tmp_path / "a", "cpu-x", "cpu", HOST)
    with pytest.raises(ProfilerError, match="measured twice"):
        write_profile_set([measured[0], measured[0]], tmp_path / "a", "cpu-x", "cpu", HOST)
    other = Measurement.from_samples("x", "zoo:x", None, 1, 7, [1.0])
    with pytest.raises(ProfilerError, match="mixed"):
        write_profile_set([measured[0], other], tmp_path / "a", "cpu-x", "cpu", HOST)
    with pytest.raises(InputError, match="unknown device kind"):
        write_profile_set(measured, tmp_path / "a", "cpu-x", "tpu", HOST)
    assert not (tmp_path / "a").exists()


def test_output_directory_rules_and_atomicity(measured: list[Measurement], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    write_profile_set(measured, empty, "cpu-e", "cpu", HOST)  # an empty directory is fine
    assert load_catalog_from(empty).catalogs() == ["cpu-e"]
    write_profile_set(measured[:1], empty, "cpu-e2", "cpu", HOST)  # our own earlier set is replaced
    assert list(load_catalog_from(empty).profiles) == ["cpu-e2/squeezenet1_1"]  # one row: no ':variant'

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ProfilerError, match="--force"):
        write_profile_set(measured, foreign, "cpu-f", "cpu", HOST)
    assert (foreign / "notes.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ProfilerError, match="not a directory"):
        write_profile_set(measured, a_file, "cpu-f", "cpu", HOST)
    write_profile_set(measured, foreign, "cpu-f", "cpu", HOST, force=True)
    assert not (foreign / "notes.txt").exists() and load_catalog_from(foreign).catalogs() == ["cpu-f"]

    # a failure after writing (here: the read-back check) leaves the previous set and no temporary files
    def broken(directory: Path, label: str | None = None) -> None:
        raise CatalogDataError("file", "simulated failure", label)

    monkeypatch.setattr(profiler, "load_catalog_from", broken)
    with pytest.raises(CatalogDataError, match="simulated"):
        write_profile_set(measured, foreign, "cpu-g", "cpu", HOST, force=True)
    monkeypatch.undo()
    assert load_catalog_from(foreign).catalogs() == ["cpu-f"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "foreign"]


# ---------------------------------------------------------------------------------- combined catalogs


def test_combined_catalog(measured: list[Measurement], tmp_path: Path) -> None:
    builtin = load_builtin_catalog()
    s1 = write_profile_set(measured, tmp_path / "s1", "cpu-one", "cpu", HOST)
    s2 = write_profile_set(measured[:1], tmp_path / "s2", "cpu-two", "cpu", HOST)
    assert load_catalog() is builtin and active_profile_sets() == ()
    both = load_catalog([s1, str(s2)])
    assert both.catalogs() == [*builtin.catalogs(), "cpu-one", "cpu-two"]
    assert both.get("ibis-edgetpu/inception_v4") == builtin.get("ibis-edgetpu/inception_v4")
    assert both.find("squeezenet1_1", "cpu").name == "cpu-one/squeezenet1_1:64x64-b1"  # earlier set first
    assert both.find("squeezenet1_1", "cpu", "cpu-two").name == "cpu-two/squeezenet1_1"
    assert both.constants == builtin.constants and len(both.columns) == len(builtin.columns) + 8
    with use_profile_sets([s1]) as cat:
        assert load_catalog() is cat and load_catalog() is load_catalog()  # one shared object meanwhile
        assert active_profile_sets() == (s1,) and "cpu-one" in cat.catalogs()
        assert "cpu-two" in load_catalog([s2]).catalogs()
        with use_profile_sets([s2]):
            assert load_catalog().catalogs()[-2:] == ["cpu-one", "cpu-two"]
        assert load_catalog() is cat
    assert load_catalog() is builtin and active_profile_sets() == ()
    with use_profile_sets([]) as cat:
        assert cat is builtin

    with pytest.raises(CatalogDataError, match="already defined"):
        load_catalog([s1, s1])
    with pytest.raises(CatalogDataError, match="no such profile-set directory"):
        load_catalog([tmp_path / "absent"])
    with pytest.raises(CatalogDataError):
        load_catalog([tmp_path])  # a directory that is not a profile set
    # a column declared differently from the built-in declaration of the same name (gflops: a number)
    bad = write_profile_set(measured[:1], tmp_path / "s3", "cpu-three", "cpu", HOST)
    index = (bad / "catalogs.yaml").read_text()
    (bad / "catalogs.yaml").write_text(index.replace("columns:\n", "columns:\n  gflops: {type: text, meaning: x}\n", 1))
    assert load_catalog_from(bad).columns["gflops"].type == "text"  # valid on its own
    with pytest.raises(CatalogDataError, match="gflops"):
        load_catalog([bad])
    assert load_catalog() is builtin


def test_catalog_module_has_no_leftover_state() -> None:
    assert catalog_mod.active_profile_sets() == () and load_catalog() is load_builtin_catalog()


# ----------------------------------------------------------------------------------------------- CLI


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


SCENARIO = """\
apiVersion: edgemux/v1alpha1
kind: Scenario
metadata: {{name: cpu-node}}
spec:
  nodes:
    - name: n1
      devices:
        - {{name: cpu0, kind: cpu, profiles: {cat}}}
  apps:
    - {{name: a, model: squeezenet1_1, device: n1/cpu0, rate: 5, slo: {{latencyMs: 1000, stat: mean}}}}
"""
CLUSTER = """\
apiVersion: edgemux/v1alpha1
kind: Cluster
metadata: {{name: one-cpu}}
spec:
  nodes:
    - name: n1
      cpuCores: 4
      memoryMb: 4096
      devices:
        - {{name: cpu0, kind: cpu, memoryMb: 2048, profiles: {cat}}}
"""
APPS = """\
apiVersion: edgemux/v1alpha1
kind: AppList
metadata: {name: cpu-apps}
spec:
  apps:
    - {name: a, model: squeezenet1_1, rate: 5, slo: {latencyMs: 1000, stat: mean}}
"""


@pytest.fixture
def zoo_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGEMUX_CACHE", str(cache))  # the CLI builds zoo models under $EDGEMUX_CACHE/zoo
    return cache


def test_cli_profile_then_predict_and_place(zoo_cache: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "cpu-set"
    code, out, err = _run(["profile", "--backend", "onnxruntime", "--models", f"squeezenet1_1@{SIZE}",
                           "--batch", "1,2", "--warmup", "1", "--repeats", "3", "--out", str(out_dir),
                           "--catalog", "cpu-cli"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["MODEL", "VARIANT", "BATCH", "MEAN", "MS", "P95", "MS", "CV"]
    assert lines[2].split()[:3] == ["squeezenet1_1", f"{SIZE}x{SIZE}-b1", "1"]
    assert lines[3].split()[:3] == ["squeezenet1_1", f"{SIZE}x{SIZE}-b2", "2"]
    assert str(out_dir) in out and "'cpu-cli'" in out
    cat = load_catalog_from(out_dir)
    assert cat.find("squeezenet1_1", "cpu").provenance.source.startswith("measured with onnxruntime ")
    assert load_catalog() is load_builtin_catalog()

    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO.format(cat="cpu-cli"))
    code, out, err = _run(["predict", str(scenario), "--profiles", str(out_dir), "--json"], capsys)
    assert code == 0, err
    assert "cpu-cli/squeezenet1_1:64x64-b1" in out and '"a"' in out
    code, out, err = _run(["predict", str(scenario)], capsys)  # without the set the name is unknown
    assert code == 2 and "unknown profile set 'cpu-cli'" in err and len(err.splitlines()) == 1

    cluster, apps = tmp_path / "cluster.yaml", tmp_path / "apps.yaml"
    cluster.write_text(CLUSTER.format(cat="cpu-cli"))
    apps.write_text(APPS)
    code, out, err = _run(["place", "--cluster", str(cluster), "--apps", str(apps), "--policy", "edgemux",
                           "--profiles", str(out_dir), "--json"], capsys)
    assert code == 0, err
    decision = json.loads(out)["decisions"][0]
    assert decision["decision"] == "placed"
    assert decision["shares"][0] == {"device": "n1/cpu0", "weight": 1.0,
                                     "profile": "cpu-cli/squeezenet1_1:64x64-b1"}
    assert load_catalog() is load_builtin_catalog()  # the command leaves no trace


def test_cli_profile_replaces_its_own_set_and_protects_others(zoo_cache: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    base = ["profile", "--models", f"squeezenet1_1@{SIZE}x{SIZE}", "--warmup", "0", "--repeats", "1"]
    out_dir = tmp_path / "set"
    assert _run(base + ["--out", str(out_dir), "--catalog", "cpu-a"], capsys)[0] == 0
    assert _run(base + ["--out", str(out_dir), "--catalog", "cpu-b"], capsys)[0] == 0
    assert load_catalog_from(out_dir).catalogs() == ["cpu-b"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.txt").write_text("keep")
    code, _, err = _run(base + ["--out", str(foreign)], capsys)
    assert code == 2 and "--force" in err and len(err.splitlines()) == 1
    assert _run(base + ["--out", str(foreign), "--force", "--catalog", "cpu-c"], capsys)[0] == 0
    assert load_catalog_from(foreign).catalogs() == ["cpu-c"]


@pytest.mark.parametrize("extra, needle", [
    (["--models", "nosuchnet"], "mobilenet_v2"),  # lists the known models
    (["--models", "squeezenet1_1@abc"], "bad input size"),
    (["--models", "squeezenet1_1@16"], "too small"),
    (["--models", "squeezenet1_1,"], "empty model name"),
    (["--models", "missing.onnx"], "does not exist"),
    (["--batch", "1,x"], "--batch"),
    (["--batch", "0"], "--batch"),
    (["--batch", ""], "--batch"),
    (["--backend", "tensorrt"], "onnxruntime"),
    (["--backend", "emulated"], "unknown backend"),
    (["--repeats", "0"], "--repeats"),
    (["--repeats", "-3"], "--repeats"),
    (["--repeats", "many"], "invalid int"),
    (["--warmup", "-1"], "--warmup"),
    (["--threads", "0"], "--threads"),
    (["--catalog", "Bad_Name"], "lower-case"),
    (["--catalog", "ibis-edgetpu"], "built-in"),
    (["--shares", "0,0.5"], "(0, 1]"),
    (["--shares", "0.5,1.5"], "(0, 1]"),
    (["--shares", "nan"], "(0, 1]"),
    (["--shares", "half"], "--shares"),
    (["--shares", "0.5", "--batch", "2"], "batch-1"),
    (["--models", "model.tflite"], "measure it with --backend litert"),
    (["--backend", "litert"], "not a .tflite file"),
])
def test_cli_profile_bad_input_is_one_line_exit_2(extra: list[str], needle: str, zoo_cache: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", "--models", f"squeezenet1_1@{SIZE}", "--warmup", "0", "--repeats", "1",
            "--out", str(tmp_path / "out")]
    code, out, err = _run(argv + extra, capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "out").exists()


def test_cli_profile_requires_models_and_out(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["profile", "--out", "x"], ["profile", "--models", "squeezenet1_1"]):
        code, _, err = _run(argv, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["predict", "place", "simulate"])
def test_cli_profiles_option_bad_directories(command: str, tmp_path: Path, measured: list[Measurement],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO.format(cat="cpu-opt"))
    (tmp_path / "cluster.yaml").write_text(CLUSTER.format(cat="cpu-opt"))
    (tmp_path / "apps.yaml").write_text(APPS)
    argv = {"predict": ["predict", str(scenario)], "simulate": ["simulate", str(scenario), "--requests", "100",
                                                                "--replications", "2"],
            "place": ["place", "--cluster", str(tmp_path / "cluster.yaml"), "--apps", str(tmp_path / "apps.yaml"),
                      "--policy", "knapsack"]}[command]
    good = write_profile_set(measured, tmp_path / "good", "cpu-opt", "cpu", HOST)
    not_a_set = tmp_path / "empty"
    not_a_set.mkdir()
    for dirs, needle in (([tmp_path / "absent"], "no such profile-set directory"),
                         ([not_a_set], "catalogs.yaml"), ([good, good], "already defined")):
        code, out, err = _run(argv + [a for d in dirs for a in ("--profiles", str(d))], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert load_catalog() is load_builtin_catalog()
    code, out, err = _run(argv + ["--profiles", str(good)], capsys)
    assert code == 0, err


# ---------------------------------------------------------------------------------------- share curves


def test_share_curve_from_fake_timer_and_its_knee(source: ModelSource) -> None:
    """On 4 cores shares 0.25, 0.5, 1.0 run 1, 2, 4 threads; the fake timer makes those 40, 20, 19 ms (each
    thread count measured once, 3 runs): the curve is those medians and its knee is 0.5."""
    timer = FakeTimer([0.040] * 3 + [0.020] * 3 + [0.019] * 3)
    [c] = profiler.profile_share_curves([source], [1.0, 0.25, 0.5], 4, 0, 3, timer=timer)
    assert c.threads == (1, 2, 4)
    assert c.curve == ((0.25, pytest.approx(40.0)), (0.5, pytest.approx(20.0)), (1.0, pytest.approx(19.0)))
    assert c.problem is None
    from edgemux.perf.spatial import knee

    assert knee(c.curve) == 0.5


def test_shares_on_the_same_thread_count_are_measured_once(source: ModelSource) -> None:
    timer = FakeTimer([0.010] * 2 + [0.012] * 2)
    [c] = profiler.profile_share_curves([source], [0.25, 0.5, 1.0], 2, 0, 2, timer=timer)
    assert c.threads == (1, 1, 2) and len(c.measurements) == 2
    assert c.points[0][1] == c.points[1][1]


def test_a_rising_curve_is_reported_not_written(source: ModelSource, measured: list[Measurement],
                                                tmp_path: Path) -> None:
    timer = FakeTimer([0.010] * 2 + [0.020] * 2)  # 2 threads twice as slow as 1: not a share curve
    [c] = profiler.profile_share_curves([source], [0.5, 1.0], 2, 0, 2, timer=timer)
    assert c.curve is None and "must not increase" in (c.problem or "")
    with pytest.raises(ProfilerError, match="must not increase"):
        write_profile_set(measured, tmp_path / "s", "cpu-bad", host=HostInfo(
            "onnxruntime", "1", ("CPUExecutionProvider",), 1, "n", None, "2026-01-01T00:00:00Z"),
            share_curves={measured[0].source: c.points})
    assert not (tmp_path / "s").exists()
    with pytest.raises(ProfilerError, match="--shares"):
        profiler.profile_share_curves([source], [0.0, 1.0], 2, 0, 1)


def test_cli_profile_shares_writes_a_curve_check_curve_accepts(zoo_cache: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """One core (patched): every share runs 1 thread, measured once, so the curve is flat whatever the host's
    load, and is written; the loaded profile's share_curve passes check_curve and the knee is printed."""
    from edgemux.perf.spatial import check_curve
    from edgemux.runtime.dataplane import instances

    monkeypatch.setattr(instances, "cpu_cores", lambda: 1)
    out_dir = tmp_path / "curve-set"
    code, out, err = _run(["profile", "--models", f"squeezenet1_1@{SIZE}", "--warmup", "1", "--repeats", "3",
                           "--shares", "0.25,0.5,1.0", "--out", str(out_dir), "--catalog", "cpu-curve"], capsys)
    assert code == 0, err
    assert "knee at share 0.25" in out and "1 cores" in out
    cat = load_catalog_from(out_dir)
    p = cat.find("squeezenet1_1", DeviceKind.CPU, "cpu-curve")
    assert [s for s, _ in p.share_curve] == [0.25, 0.5, 1.0]
    assert check_curve(p.share_curve) == p.share_curve


TFLITE = Path(__file__).resolve().parents[1] / "examples" / "models" / "coral" / "mobilenet_v1_0.25_128_quant.tflite"


def test_cli_profile_measures_a_tflite_model_on_litert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ai_edge_litert")
    out_dir = tmp_path / "tfl"
    code, out, err = _run(["profile", "--backend", "litert", "--models", str(TFLITE), "--shares", "0.5,1",
                           "--warmup", "1", "--repeats", "5", "--out", str(out_dir), "--catalog", "cpu-tfl"], capsys)
    assert code in (0, 1), err  # 1: a curve not non-increasing on a busy host (said, and not written)
    assert out.splitlines()[2].split()[:3] == ["mobilenet_v1_0.25_128_quant", "128x128-b1", "1"]
    profile = load_catalog_from(out_dir).find("mobilenet_v1_0.25_128_quant", "cpu")
    assert profile.provenance.source.startswith("measured with litert 2.")
    assert "(litert, 1 threads)" in profile.provenance.source
    # the Edge TPU build: one line, exit 2, nothing written
    tpu = TFLITE.with_name("mobilenet_v1_0.25_128_quant_edgetpu.tflite")
    code, out, err = _run(["profile", "--backend", "litert", "--models", str(tpu), "--warmup", "0", "--repeats", "1",
                           "--out", str(tmp_path / "tpu")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "compiled for the Edge TPU" in err, err
    assert not (tmp_path / "tpu").exists()
