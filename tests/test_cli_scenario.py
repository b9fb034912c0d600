"""CLI tests: predict/simulate on the examples, and every bad-input case gives one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import EXAMPLES
from edgemux.cli.main import main

GOOD = """\
apiVersion: edgemux/v1alpha1
kind: Scenario
metadata: {name: t}
spec:
  nodes:
    - name: n1
      devices:
        - {name: tpu0, kind: edgetpu, discipline: fcfs, profiles: ibis-edgetpu}
  apps:
    - {name: a, model: mobilenet_v2, device: n1/tpu0, rate: 20, slo: {latencyMs: 50, stat: mean}}
    - {name: b, model: inception_v3, device: n1/tpu0, rate: 4, slo: {latencyMs: 150, stat: p95}}
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_table_and_json(write_yaml, capsys):
    p = write_yaml(GOOD)
    code, out, err = run(["predict", str(p)], capsys)
    assert code == 0, err
    assert "mobilenet_v2" in out and "inception_v3" in out and "emulated" in out
    code, out, _ = run(["predict", str(p), "--json"], capsys)
    data = json.loads(out)
    apps = {a["app"]: a for a in data["apps"]}
    # Hand check of Ibis Eq. 1-5 for app a: p_a = 20/24, S_a = 4.91 + (1-p_a) * 10.43
    p_a = 20 / 24
    s_a = 4.91 + (1 - p_a) * 10.43
    assert apps["a"]["mean_ms"] > s_a
    assert apps["a"]["verdict"] == "meets"
    assert apps["b"]["p95_ms"] > apps["b"]["mean_ms"]


def test_unstable_is_explicit(write_yaml, capsys):
    p = write_yaml(GOOD.replace("rate: 4,", "rate: 40,"))
    code, out, _ = run(["predict", str(p), "--json"], capsys)
    assert code == 0
    apps = {a["app"]: a for a in json.loads(out)["apps"]}
    assert apps["b"]["mean_ms"] == "unstable" and apps["b"]["verdict"] == "VIOLATES"


def test_simulate_side_by_side(write_yaml, capsys):
    p = write_yaml(GOOD)
    code, out, err = run(["simulate", str(p), "--requests", "4000", "--replications", "3", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    for a in data["apps"]:
        sim = a["sim"]["mean"]
        assert sim["lo"] <= sim["value"] <= sim["hi"]
        assert a["predicted"]["mean_ms"] > 0


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_examples_predict_and_simulate(example, capsys):
    code, out, err = run(["predict", str(EXAMPLES / example)], capsys)
    assert code == 0, err
    code, out, err = run(["simulate", str(EXAMPLES / example), "--requests", "3000", "--replications", "2"], capsys)
    assert code == 0, err


BAD = {
    "malformed yaml": ("spec: [unclosed", "malformed YAML"),
    "not a mapping": ("- 1\n- 2\n", "expected a mapping"),
    "wrong api": (GOOD.replace("edgemux/v1alpha1", "v1"), "apiVersion"),
    "unknown model": (GOOD.replace("model: mobilenet_v2", "model: nosuchnet"), "spec.apps[0].model"),
    "no profile for kind": (GOOD.replace("kind: edgetpu, discipline: fcfs, profiles: ibis-edgetpu",
                                         "kind: fpga, discipline: fcfs"), "spec.apps[0].model"),
    "negative rate": (GOOD.replace("rate: 20", "rate: -3"), "spec.apps[0].rate: must be > 0"),
    "zero fps": (GOOD.replace("rate: 20", "fps: 0"), "spec.apps[0].fps"),
    "rate and fps": (GOOD.replace("rate: 20", "rate: 20, fps: 15"), "exactly one"),
    "string rate": (GOOD.replace("rate: 20", "rate: fast"), "expected a finite number"),
    "unknown discipline": (GOOD.replace("discipline: fcfs", "discipline: lifo"), "unknown discipline 'lifo'"),
    "unknown kind": (GOOD.replace("kind: edgetpu", "kind: quantum"), "unknown device kind"),
    "unknown device": (GOOD.replace("device: n1/tpu0, rate: 20", "device: n9/tpu0, rate: 20"),
                       "spec.apps[0].device"),
    "unknown profile set": (GOOD.replace("profiles: ibis-edgetpu", "profiles: nope"), "profiles"),
    "bad slo stat": (GOOD.replace("stat: mean", "stat: p42"), "spec.apps[0].slo.stat"),
    "negative slo": (GOOD.replace("latencyMs: 50", "latencyMs: -1"), "latencyMs"),
    "duplicate app": (GOOD.replace("name: b,", "name: a,"), "duplicate app"),
    "missing apps": (GOOD.split("  apps:")[0], "spec.apps: is required"),
    "profile without batch 1": (GOOD.replace("kind: edgetpu, discipline: fcfs, profiles: ibis-edgetpu",
                                             "kind: gpu-discrete, profiles: dhakal-v100").replace(
                                    "model: mobilenet_v2", "model: resnet50"), "no execution time at batch 1"),
    "servers below one": (GOOD.replace("profiles: ibis-edgetpu", "profiles: ibis-edgetpu, servers: 0.5"),
                          "servers"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("verb", ["predict", "simulate"])
def test_bad_input_one_line_exit_2(case, verb, write_yaml, capsys):
    text, needle = BAD[case]
    p = write_yaml(text)
    code, out, err = run([verb, str(p)], capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("edgemux: error: ")
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err


def test_missing_file_and_bad_options(tmp_path, write_yaml, capsys):
    code, _, err = run(["predict", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "no such file" in err and len(err.strip().splitlines()) == 1
    p = write_yaml(GOOD)
    code, _, err = run(["simulate", str(p), "--replications", "1"], capsys)
    assert code == 2 and "--replications" in err
    code, _, err = run(["simulate", str(p), "--requests", "abc"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    code, _, err = run(["frobnicate"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "invalid choice" in err


def test_console_script_no_traceback(write_yaml):
    """The installed entry point (a separate process) also answers bad input with one line and exit 2."""
    p = write_yaml(GOOD.replace("discipline: fcfs", "discipline: lifo"))
    proc = subprocess.run([sys.executable, "-m", "edgemux", "predict", str(p)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


SPATIAL_TWO_APPS = """apiVersion: edgemux/v1alpha1
kind: Scenario
metadata: {name: sp}
spec:
  nodes:
    - name: n1
      devices:
        - {name: gpu0, kind: gpu-discrete, discipline: spatial, profiles: dhakal-v100}
  apps:
    - {name: a, model: mobilenet, device: n1/gpu0, rate: 100}
    - {name: b, model: mobilenet, device: n1/gpu0, rate: 100}
"""


@pytest.mark.parametrize("verb", ["predict", "simulate"])
def test_two_apps_pinned_to_one_spatial_device_are_one_line_and_exit_2(tmp_path, capsys, verb):
    path = tmp_path / "sp.yaml"
    path.write_text(SPATIAL_TWO_APPS)
    assert main([verb, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hold 2 of the device" in err and "edgemux place" in err
