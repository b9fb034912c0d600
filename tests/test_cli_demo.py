"""``edgemux demo`` (what ``make demo`` runs) end to end: the local cluster comes up, the example apps are
admitted or rejected with a reason, every admitted app is driven through the gateway, the table puts the
prediction beside the observation and says which devices were emulated, and the cluster stops; then the
second act's surge is detected and the surging app moved without a failed request."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgemux.cli.main import main


@pytest.mark.slow
def test_demo_runs_end_to_end() -> None:
    r = subprocess.run([sys.executable, "-m", "edgemux", "demo", "--duration", "1"], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "REJECTED" in out and "cam-hd" in out                      # a rejection, with its reason
    assert "REAL (onnxruntime)" in out and "emulated from profiles" in out
    assert "pred mean" in out and "device mean" in out and "end-to-end mean" in out
    assert "classify-lite" in out and "cpu-1/cpu0 (REAL, LiteRT)" in out    # a real TFLite model, labelled
    for app in ("cam-entrance", "detect-people", "classify", "cpu-squeeze", "classify-lite"):
        assert app in out.split("pred mean", 1)[1], app                   # every admitted app was driven
    assert "emulated devices" in out and "cluster stopped." in out
    # act 2, adaptation: eff's surge is found, eff moves to the idle n2/tpu0 make before break, nothing fails
    act2 = out.split("act 2: adaptation", 1)[1]
    assert "over-contract" in act2 and "moved         eff: now at n2/tpu0" in act2, act2
    assert "requests failed (not a policing 429): 0;" in act2 and "second cluster stopped." in act2


def test_demo_bad_arguments_are_one_line_exit_2(capsys, tmp_path) -> None:
    assert main(["demo", "--duration", "0"]) == 2
    assert main(["demo", "--apps", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("edgemux: error:") for line in err), err
