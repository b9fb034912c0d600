"""Built-in catalogs: they load, the transcribed numbers match the sources, lookups and errors behave."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from edgemux.errors import InputError, UnknownNameError
from edgemux.profiles.catalog import (
    STANDARD_COLUMNS,
    CatalogDataError,
    data_dir,
    load_catalog,
    load_catalog_from,
    normalize_model_name,
)
from edgemux.profiles.types import DeviceKind

CAT = load_catalog()

EDGETPU_MODELS = {  # exactly the names of the Ibis Edge TPU validation README/CSVs
    "efficientnet-S", "efficientnet-M", "efficientnet-L", "mobilenet_v1", "mobilenet_v2",
    "inception_v3", "inception_v4", "ssd_mobilenet_v1", "ssd_mobilenet_v2",
}


def _csv_data_rows(name: str) -> int:
    lines = (data_dir() / name).read_text(encoding="utf-8").splitlines()
    return sum(1 for ln in lines if ln.strip() and not ln.lstrip().startswith("#")) - 1  # minus header


# ------------------------------------------------------------------------------------------- loading


def test_every_catalog_loads_with_expected_sizes() -> None:
    sizes = {c: sum(1 for n in CAT.profiles if n.startswith(c + "/")) for c in CAT.catalogs()}
    assert sizes == {"ibis-edgetpu": 9, "microedge": 3, "ibis-jetson-nano": 21, "dhakal-v100": 4, "dhakal-t4": 9}
    for name in CAT.catalogs():
        info = CAT.info(name)
        assert info.source and info.description
        assert all(p.device_kind is info.device_kind for p in CAT.profiles.values()
                   if CAT.catalog_of(p) == name)


def test_load_catalog_is_cached_and_read_only() -> None:
    assert load_catalog() is CAT
    with pytest.raises(TypeError):
        CAT.profiles["x"] = CAT.profiles["ibis-edgetpu/inception_v4"]  # type: ignore[index]


def test_names_unique_one_profile_per_data_row() -> None:
    rows = sum(_csv_data_rows(CAT.info(c).file) for c in CAT.catalogs())
    assert len(CAT.profiles) == rows
    for name, p in CAT.profiles.items():
        assert name == p.name
        assert name.startswith(CAT.catalog_of(p) + "/" + p.model)


def test_every_profile_and_constant_has_provenance() -> None:
    for p in CAT.profiles.values():
        assert p.provenance.source.strip(), p.name
        assert p.provenance.detail.strip(), p.name
    for c in CAT.constants.values():
        assert c.provenance.source.strip() and c.provenance.detail.strip(), c.key
        assert c.unit and c.meaning and math.isfinite(c.value)


def test_profiles_are_physically_sane_and_extras_declared() -> None:
    for p in CAT.profiles.values():
        for b, e in p.exec.items():
            assert b == e.batch >= 1 and e.mean_ms > 0 and e.var_ms2 >= 0
        assert p.switch_ms >= 0
        for key in p.extra:
            assert key in CAT.columns and key not in STANDARD_COLUMNS, (p.name, key)
        for share, ms in p.share_curve:
            assert 0 < share <= 1 and ms > 0


# ---------------------------------------------------------------------------- transcribed values


def test_edgetpu_names_and_values_match_validation_readme() -> None:
    tpu = {p.model: p for p in CAT.profiles.values() if CAT.catalog_of(p) == "ibis-edgetpu"}
    assert set(tpu) == EDGETPU_MODELS
    expected = {  # (execution ms, switch ms) from shared/validation/ibis-edgetpu/README.md
        "efficientnet-S": (9.83, 17.33), "efficientnet-M": (15.85, 22.63), "efficientnet-L": (42.18, 17.53),
        "mobilenet_v1": (4.55, 15.12), "mobilenet_v2": (4.91, 10.43), "inception_v3": (62.95, 19.39),
        "inception_v4": (125.13, 19.43), "ssd_mobilenet_v1": (18.03, 23.93), "ssd_mobilenet_v2": (19.23, 24.63),
    }
    for model, (exec_ms, switch_ms) in expected.items():
        p = tpu[model]
        assert p.exec_time(1).mean_ms == exec_ms and p.switch_ms == switch_ms
        assert p.exec_time(1).var_ms2 == 0  # deterministic per Ibis
    v4 = CAT.get("ibis-edgetpu/inception_v4")
    assert (v4.extra["params_onchip_mb"], v4.extra["params_offchip_mb"]) == (6.03, 36.13)
    assert v4.service.mean == 125.13 and v4.service.var == 0


def test_edgetpu_memory_is_onchip_plus_offchip_and_service_rates_consistent() -> None:
    for p in CAT.profiles.values():
        if "params_onchip_mb" in p.extra:
            total = float(p.extra["params_onchip_mb"]) + float(p.extra["params_offchip_mb"])
            assert p.memory_static_mb == pytest.approx(total, abs=1e-9)
    for model in ("inception_v3", "inception_v4"):  # README: service_rate ~= 1000/(exec + switch)
        p = CAT.get(f"ibis-edgetpu/{model}")
        rate = 1000.0 / (p.exec_time(1).mean_ms + p.switch_ms)
        assert p.extra["validation_service_rate_rps"] == pytest.approx(rate, abs=0.02)
    assert "EdgeTPU" not in "".join(CAT.profiles)  # names keep the CSVs' spelling
    assert "MIT" in CAT.get("ibis-edgetpu/mobilenet_v1").provenance.source


# Ibis Table 2 as the text extraction printed it, column by column (paper 000, lines 740-878).
T2_PARAMS = [62, 6, 24, 3.5, 12, 21.2, 26, 44.5, 5.3, 7.8, 9.2, 12, 19, 30, 7.2, 20, 138, 144, 62, 6.06, 64.43]
T2_STATIC = [138, 39, 81, 22, 69, 155, 106, 247, 30, 42, 49, 77, 124, 180, 50, 103, 407, 463, 617, 75, 445]
T2_RUNTIME = [992, 893, 836, 1130, 930, 1044, 965, 1135, 1168, 1184, 1196, 1229, 1042, 180, 910, 964, 1275,
              1333, 1501, 938, 1329]
T2_GFLOPS = [0.7, 2, 6, 0.6, 1.8, 3.6, 3.8, 7.6, 0.4, 0.7, 1, 1.8, 4.2, 9.9, 3, 4, 16, 20, 65.88, 6.91, 128.46]
T2_MS = [14.18, 13.37, 30.56, 13.02, 10.83, 19.51, 29.2, 50.32, 26.03, 41.32, 49.58, 81.67, 166.15, 337.44,
         30.14, 89.11, 86.36, 99.19, 190.24, 23.79, 407.91]


def test_ibis_table2_columns_match_extraction_row_by_row() -> None:
    rows = [p for p in CAT.profiles.values() if CAT.catalog_of(p) == "ibis-jetson-nano"]
    assert len(rows) == 21
    assert [p.extra["params_m"] for p in rows] == T2_PARAMS
    assert [p.memory_static_mb for p in rows] == T2_STATIC
    assert [p.memory_runtime_mb for p in rows] == T2_RUNTIME
    assert [p.extra["gflops"] for p in rows] == T2_GFLOPS
    assert [p.exec_time(1).mean_ms for p in rows] == T2_MS
    assert all(p.device_kind is DeviceKind.GPU_EMBEDDED and p.extra["precision"] == "fp16" for p in rows)


def test_ibis_alexnet_row_and_inferred_names() -> None:
    a = CAT.get("ibis-jetson-nano/alexnet")
    assert (a.extra["params_m"], a.extra["gflops"], a.memory_static_mb, a.memory_runtime_mb) == (62, 0.7, 138, 992)
    assert a.exec_time(1).mean_ms == 14.18 and a.memory_total_mb == 1130
    assert "AlexNet" in str(a.extra["name_inferred_from"]) and "inferred" in a.provenance.note
    classification = [p for p in CAT.profiles.values()
                      if CAT.catalog_of(p) == "ibis-jetson-nano" and p.extra["task"] == "classification"]
    assert len(classification) == 18 and all(p.extra.get("name_inferred_from") for p in classification)
    detection = [p.model for p in CAT.profiles.values()
                 if CAT.catalog_of(p) == "ibis-jetson-nano" and p.extra["task"] == "detection"]
    assert detection == ["yolov3", "yolov4_tiny", "yolov4"]
    assert CAT.get("ibis-jetson-nano/yolov4").extra["size_category"] == "L"


def test_microedge_tpu_units_derivation() -> None:
    for model, units in (("ssd_mobilenet_v2", 0.35), ("bodypix", 1.2)):
        p = CAT.get(f"microedge/{model}")
        assert p.extra["tpu_units_15fps"] == units
        assert p.exec_time(1).mean_ms == pytest.approx(units * 1000 / 15, abs=1e-5)
        assert p.switch_ms == 0  # t/T already includes model switching
    lite = CAT.get("microedge/efficientnet_lite0")
    assert lite.exec_time(1).mean_ms == 69
    assert lite.extra["tpu_units_15fps"] == pytest.approx(69 * 15 / 1000)


def test_microedge_constants_and_cost_table() -> None:
    k = CAT.constants
    assert k["microedge.tpu_memory_mb"].value == 8 and k["microedge.tpu_memory_mb"].unit == "MB"
    assert k["microedge.tpu_param_memory_mb"].value == 6.9
    tpu, rpi = k["microedge.cost.tpu_usd"].value, k["microedge.cost.rpi_usd"].value
    for cfg in ("baseline", "no_partitioning", "partitioning"):
        n_tpu, n_rpi = k[f"microedge.cost.{cfg}_tpus"].value, k[f"microedge.cost.{cfg}_rpis"].value
        assert n_tpu * tpu + n_rpi * rpi == k[f"microedge.cost.{cfg}_usd"].value


def test_dhakal_tables() -> None:
    table1 = {"alexnet": (3.67, 4.01), "resnet50": (9.76, 10.53), "vgg19": (30.49, 30.95)}
    for model, (dma, copy) in table1.items():
        p = CAT.get(f"dhakal-v100/{model}")
        assert p.exec_time(8).mean_ms == dma and p.extra["latency_cuda_copy_ms"] == copy
        assert 1 not in p.exec
    table4 = {  # model: (lat 1 inst, thrpt 1 inst, n inst, lat n inst, thrpt n inst)
        "mobilenet": (18.8, 1218, 4, 19.77, 2310), "alexnet": (16.9, 1656, 4, 18.9, 2539),
        "resnet50": (25.7, 155, 2, 29.1, 274), "vgg19": (45.1, 88, 2, 49.1, 162),
    }
    for model, (l1, h1, n, ln, hn) in table4.items():
        one = CAT.get(f"dhakal-t4/{model}:1x100pct")
        many = CAT.get(f"dhakal-t4/{model}:{n}x{100 // n}pct")
        assert (one.extra["latency_ms"], one.extra["throughput_rps"], one.extra["instances"]) == (l1, h1, 1)
        assert (many.extra["latency_ms"], many.extra["throughput_rps"], many.extra["instances"]) == (ln, hn, n)
        assert many.extra["gpu_share"] == pytest.approx(1 / n)
        assert not one.exec  # measured under load: not a service time


def test_dhakal_table2_counts_consistent_with_t4_memory() -> None:
    mem = CAT.constants["dhakal.t4_memory_mb"].value
    for model in ("resnet50:1x100pct", "vgg19:1x100pct", "resnext50"):
        p = CAT.get(f"dhakal-t4/{model}")
        w, buf = p.memory_static_mb, p.memory_runtime_mb
        assert w is not None and buf is not None
        without, shared = int(p.extra["max_instances_t4"]), int(p.extra["max_instances_t4_param_share"])
        assert without * (w + buf) <= mem < (without + 1) * (w + buf)
        assert w + shared * buf <= mem < w + (shared + 1) * buf


def test_mvsp_link_delay_constant() -> None:
    c = CAT.constant("mvsp.link_delay_ms")
    assert (c.value, c.unit) == (12.23, "ms")
    assert "MVSP" in c.provenance.source and "169" in c.provenance.detail
    with pytest.raises(UnknownNameError):
        CAT.constant("mvsp.nope")


# ------------------------------------------------------------------------------------------ lookups


def test_get_and_unknown_profile() -> None:
    assert CAT.get("ibis-edgetpu/inception_v3").model == "inception_v3"
    with pytest.raises(UnknownNameError) as e:
        CAT.get("ibis-edgetpu/nope")
    assert e.value.field == "profile" and "nope" in str(e.value) and "known" in str(e.value)
    with pytest.raises(UnknownNameError) as e:  # a model with variants lists them
        CAT.get("dhakal-t4/resnet50")
    assert "dhakal-t4/resnet50:2x50pct" in str(e.value)


def test_find_prefers_earlier_catalog_and_batch1() -> None:
    assert CAT.find("inception_v3", DeviceKind.EDGETPU).name == "ibis-edgetpu/inception_v3"
    assert CAT.find("ssd_mobilenet_v2", "edgetpu").name == "ibis-edgetpu/ssd_mobilenet_v2"
    assert CAT.find("ssd_mobilenet_v2", "edgetpu", "microedge").name == "microedge/ssd_mobilenet_v2"
    assert CAT.find("ResNet-50", DeviceKind.GPU_EMBEDDED).name == "ibis-jetson-nano/resnet50"
    assert CAT.find("mobilenet", DeviceKind.GPU_DISCRETE).name == "dhakal-v100/mobilenet"
    # no gpu-discrete resnet50 has a batch-1 time: the first in catalog order is returned
    assert CAT.find("resnet50", DeviceKind.GPU_DISCRETE).name == "dhakal-v100/resnet50"
    assert [p.name for p in CAT.find_all("resnet50", "gpu-discrete", "dhakal-t4")] == [
        "dhakal-t4/resnet50:1x100pct", "dhakal-t4/resnet50:2x50pct"]


def test_find_errors_name_model_and_kind() -> None:
    with pytest.raises(InputError) as e:
        CAT.find("vgg16", DeviceKind.EDGETPU)
    msg = str(e.value)
    assert "vgg16" in msg and "edgetpu" in msg and "gpu-embedded" in msg and "ibis-jetson-nano/vgg16" in msg
    with pytest.raises(UnknownNameError) as e2:
        CAT.find("no-such-net", DeviceKind.FPGA)
    assert "no-such-net" in str(e2.value) and "fpga" in str(e2.value)
    with pytest.raises(InputError) as e3:
        CAT.find("inception_v3", DeviceKind.EDGETPU, catalog="microedge")
    assert "microedge" in str(e3.value) and "ibis-edgetpu/inception_v3" in str(e3.value)
    with pytest.raises(UnknownNameError):
        CAT.find("inception_v3", DeviceKind.EDGETPU, catalog="nope")
    with pytest.raises(UnknownNameError):
        CAT.find("inception_v3", "tpu")


def test_models_and_normalization() -> None:
    assert "inception_v4" in CAT.models(DeviceKind.EDGETPU)
    assert "inception_v4" not in CAT.models(DeviceKind.GPU_EMBEDDED)
    assert CAT.models() == sorted(set(CAT.models()))
    assert normalize_model_name("MobileNet-V2") == normalize_model_name("mobilenet_v2")


# -------------------------------------------------------------------------------------- bad data


@pytest.fixture()
def data_copy(tmp_path: Path) -> Path:
    src = Path(str(data_dir()))
    dst = tmp_path / "data"
    shutil.copytree(src, dst)
    return dst


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_copy_of_packaged_data_loads(data_copy: Path) -> None:
    assert list(load_catalog_from(data_copy).profiles) == list(CAT.profiles)


@pytest.mark.parametrize(("file", "old", "new", "expect"), [
    ("ibis_edgetpu.csv", "inception_v4,edgetpu-int8,1,125.13", "inception_v4,edgetpu-int8,1,fast",
     "exec_mean_ms"),
    ("ibis_edgetpu.csv", "inception_v4,edgetpu-int8,1,125.13", "inception_v4,edgetpu-int8,1,-125.13",
     "exec_mean_ms"),
    ("ibis_edgetpu.csv", "model,variant,batch", "model,flavour,batch", "unknown column 'flavour'"),
    ("ibis_edgetpu.csv", "mobilenet_v1,edgetpu-int8", "mobilenet_v2,edgetpu-int8", "duplicate model/variant"),
    ("ibis_edgetpu.csv", "ibis-edgetpu README (umassos/ibis notebooks),EfficientNet-EdgeTPU-S",
     ",EfficientNet-EdgeTPU-S", "detail"),
    ("ibis_edgetpu.csv", "4.55,0,15.12", "4.55,0,15.12,1", "cells"),
    ("dhakal_v100.csv", "0.15:1.003;1.0:1.023", "1.5:1.003", "share"),
    ("catalogs.yaml", "device_kind: edgetpu", "device_kind: tpu", "device_kind"),
    ("catalogs.yaml", "file: microedge.csv", "file: missing.csv", "no such data file"),
    ("constants.yaml", "value: 12.23", "value: fast", "value"),
    ("constants.yaml", "source: mvsp", "source: nobody", "unknown source"),
])
def test_bad_data_fails_loudly_with_file_and_row(data_copy: Path, file: str, old: str, new: str,
                                                 expect: str) -> None:
    _replace(data_copy / file, old, new)
    with pytest.raises(CatalogDataError) as e:
        load_catalog_from(data_copy, label="data")
    msg = str(e.value)
    assert f"data/{file}" in msg and expect in msg
    if file.endswith(".csv"):
        assert "line " in msg or "header" in msg
