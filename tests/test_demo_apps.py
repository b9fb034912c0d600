"""The demo's tenants (examples/local/apps.yaml on examples/local/cluster.yaml) get the same admission
outcome however fast the host measured its cpu profile sets: five apps admitted, cam-hd rejected. (Like
cpu-squeeze's squeezenet1_1, classify-lite's model is known only from a measured set: the one `up` measures on
LiteRT, where the litert extra is installed, as `make` does.)

``edgemux up`` and ``edgemux demo`` measure squeezenet1_1@64 and mobilenet_v2@96 on the host at start-up,
so where the policy may put classify (MobileNetV2: a TPU, the GPU or the CPU) depends on the host's speed.
With cam-hd at 30 FPS that decided cam-hd's fate: rejected while classify sat on a TPU, admitted on the
freed TPU when the measured CPU was 2-3x slower than this host's (a busy CI run). This drives the real
``edgemux place`` over a range of measured CPU speeds, a profile set written here in the profiler's format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgemux.cli.main import main

REPO = Path(__file__).resolve().parent.parent
# this 2-core host's measurement (`edgemux profile --models squeezenet1_1@64,mobilenet_v2@96`), scaled below
MEASURED_MS = {"squeezenet1_1": ("64x64", 0.981), "mobilenet_v2": ("96x96", 3.960)}
# and on LiteRT (`edgemux profile --backend litert --models examples/models/coral/mobilenet_v1_0.25_128_quant.tflite`)
LITERT_MS = {"mobilenet_v1_0.25_128_quant": ("128x128", 0.485)}
COLUMNS = "model,variant,batch,exec_mean_ms,exec_var_ms2,memory_static_mb,detail,note"  # the required columns


def _cpu_profile_set(folder: Path, factor: float) -> None:
    folder.mkdir()
    (folder / "catalogs.yaml").write_text(
        "version: 1\ncolumns: {}\nsources:\n  measured: the demo's cpu models, this host's times scaled by the test\n"
        "catalogs:\n- {name: cpu-test, file: cpu-test.csv, device_kind: cpu, source: measured,\n"
        "   description: scaled cpu times}\n")
    (folder / "constants.yaml").write_text("constants: []\n")
    rows = [COLUMNS]
    for model, (size, ms) in {**MEASURED_MS, **LITERT_MS}.items():
        mean = ms * factor
        rows.append(f"{model},{size}-b1,1,{mean},{(0.08 * mean) ** 2},5.0,scaled x{factor:g},")  # cv 0.08
    (folder / "cpu-test.csv").write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0])
def test_cam_hd_is_rejected_whatever_the_measured_cpu_speed(tmp_path: Path, factor: float, capsys) -> None:
    _cpu_profile_set(tmp_path / "cpu", factor)
    code = main(["place", "--cluster", str(REPO / "examples/local/cluster.yaml"),
                 "--apps", str(REPO / "examples/local/apps.yaml"), "--policy", "edgemux",
                 "--profiles", str(tmp_path / "cpu"), "--json"])
    out = json.loads(capsys.readouterr().out)
    decisions = {d["app"]: d for d in out["decisions"]}
    assert decisions["cam-hd"]["decision"] == "rejected", decisions["cam-hd"]
    assert [a for a, d in decisions.items() if d["decision"] == "placed"] == [
        "cam-entrance", "detect-people", "classify", "cpu-squeeze", "classify-lite"], decisions
    assert [s["device"] for s in decisions["classify-lite"]["shares"]] == ["cpu-1/cpu0"]
    assert code in (0, 1)
