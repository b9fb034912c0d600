"""``edgemux profile``: measure models on a real backend and write a profile set; ``--profiles DIR``.

    edgemux profile --backend onnxruntime|cuda|litert --models mobilenet_v2,squeezenet1_1@64 [--batch 1,2,4]
                    [--threads 1] [--warmup 5] [--repeats 30] [--seed 0] [--shares 0.25,0.5,1.0]
                    --out DIR [--catalog NAME] [--force]

Each item of ``--models`` is a zoo model (``NAME`` at its standard input size, or ``NAME@SIZE`` with SIZE
``224`` or ``320x240``, height x width in pixels) or a path to an ``.onnx`` file with fixed input sizes; with
``--backend litert``, paths to ``.tflite`` files, measured on LiteRT on this CPU (``--threads`` threads; an
Edge TPU build is refused in one line: it runs only where libedgetpu does).
The set written to ``--out`` (see ``edgemux.runtime.tools.profiler``) is read by ``predict``, ``simulate`` and
``place`` with ``--profiles DIR``: a device ``kind: cpu`` with ``profiles: <catalog>`` then resolves the
measured profiles. Bad input is one line on stderr and exit code 2; times are printed in ms.

``--shares`` also measures each model's share curve (Dhakal et al. §IV-B): one batch-1 request's latency
(median, ms) alone at each share of this CPU, a share running ``max(1, round(share * cores))`` intra-op
threads; it is written into the batch-1 row's ``share_curve`` column and the knee (``perf.spatial.knee``) is
printed. With ``--backend cuda`` (onnxruntime's CUDA provider; one line and exit 2 where this onnxruntime has
none) the profile is a ``gpu-discrete`` one and a share is a GPU share: one instance in its own process at NVIDIA
MPS active-thread percentage ``max(1, round(share * 100))``, timed in that process (``gpushare``; the MPS
control daemon must run). A measured curve that is not non-increasing within ``perf.spatial.CURVE_NOISE`` is not
written: the command says so, writes the rest, and exits 1.

This module also holds the ``--profiles DIR`` option those commands share (``add_profiles_option``,
``with_profile_sets``).
"""

from __future__ import annotations

import argparse
import functools
import platform
import re
import sys
from collections.abc import Callable
from typing import Any

from edgemux.cli.progress import progress_for
from edgemux.cli.table import render
from edgemux.errors import InputError, UnknownNameError
from edgemux.profiles.types import DeviceKind

BACKENDS = ("onnxruntime", "cuda", "litert")  # real backends the profiler measures on; emulated timings are not facts


# ------------------------------------------------------------------------------------- --profiles DIR


def add_profiles_option(parser: argparse.ArgumentParser) -> None:
    """Add the repeatable ``--profiles DIR`` option (extra profile sets, after the built-in catalogs)."""
    parser.add_argument("--profiles", action="append", default=[], metavar="DIR",
                        help="extra profile-set directory (e.g. written by 'edgemux profile'); repeatable; "
                             "its catalogs come after the built-in ones and are named with 'profiles:'")


def with_profile_sets(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command so that it runs with the ``--profiles`` sets added to ``load_catalog()``; the
    setting is undone afterwards (the CLI also runs in-process, from tests)."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        # the catalog (and its YAML reader) is imported when a command runs, not when its parser is built
        from edgemux.profiles.catalog import use_profile_sets

        with use_profile_sets(getattr(args, "profiles", None) or []):
            return func(args)

    return run


# ------------------------------------------------------------------------------------------ profile


def add_parser(sub: Any) -> None:
    """Register ``profile`` on an argparse subparsers object."""
    p = sub.add_parser("profile", help="measure models on a real backend and write a profile set",
                       description="Measure execution time per model and batch size; write a profile set "
                                   "that predict, simulate and place read with --profiles DIR.")
    p.add_argument("--backend", default="onnxruntime", help=f"backend to measure on ({', '.join(BACKENDS)})")
    p.add_argument("--models", required=True, metavar="M[,M...]",
                   help="comma-separated zoo models NAME or NAME@SIZE (224 or 320x240 pixels), or .onnx files "
                        "(.tflite files with --backend litert)")
    p.add_argument("--batch", default="1", metavar="B[,B...]", help="batch sizes (default 1)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per inference (default 1)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs per model and batch (default 5)")
    p.add_argument("--repeats", type=int, default=30, help="timed runs per model and batch (default 30)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--shares", metavar="S[,S...]",
                   help="also measure the share curve at these shares of the device, each in (0, 1]; on the CPU "
                        "a share runs max(1, round(share x cores)) intra-op threads, with --backend cuda at MPS "
                        "active-thread percentage max(1, round(share x 100)) (needs the MPS daemon) "
                        "(e.g. 0.25,0.5,1.0)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the profile set to")
    p.add_argument("--catalog", metavar="NAME",
                   help="catalog name, the profiles' prefix (default: cpu-<host name>)")
    p.add_argument("--force", action="store_true", help="replace --out even if it holds something else")
    p.set_defaults(func=cmd_profile)


def default_catalog_name(kind: DeviceKind = DeviceKind.CPU, node: str | None = None) -> str:
    """``<kind>-<host>`` with the host name reduced to what a catalog name may hold."""
    slug = re.sub(r"[^a-z0-9]+", "-", (platform.node() if node is None else node).lower()).strip("-")
    return f"{kind.value}-{slug}" if slug else f"{kind.value}-measured"


def parse_batches(text: str) -> list[int]:
    """``1,2,4`` -> [1, 2, 4]; ``InputError`` (field --batch) for anything but positive integers."""
    items = [t.strip() for t in text.split(",")]
    out: list[int] = []
    for t in items:
        if not t.isdigit() or int(t) < 1:
            raise InputError("--batch", f"expected comma-separated positive integers, got {text!r}")
        if int(t) not in out:
            out.append(int(t))
    return sorted(out)


def parse_models(text: str, backend: str = "onnxruntime") -> list[Any]:
    """The model sources of ``--models``: ``UnknownNameError`` listing the zoo models for an unknown name,
    ``InputError`` for a bad size, a missing file, or a file of the other format than ``backend`` runs
    (``.tflite`` on ``litert``, zoo models and ``.onnx`` on the others)."""
    from edgemux.runtime import zoo
    from edgemux.runtime.dataplane.backends import ModelSource

    sources = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            raise InputError("--models", f"empty model name in {text!r}")
        tflite = item.lower().endswith(".tflite")
        if tflite != (backend == "litert"):
            raise InputError("--models", f"{item!r} is not a .tflite file: --backend litert measures TFLite models"
                             if not tflite else f"{item!r} is a TFLite model: measure it with --backend litert")
        if tflite or item.lower().endswith(".onnx"):
            from pathlib import Path

            if not Path(item).is_file():
                raise InputError("--models", f"{'TFLite' if tflite else 'ONNX'} file {item!r} does not exist")
            sources.append(ModelSource(path=item))
            continue
        name, at, size_text = item.partition("@")
        if name not in zoo.MODELS:
            raise UnknownNameError("--models", name, "model", list(zoo.MODELS))
        size: tuple[int, int] | None = None
        if at:
            h, _, w = size_text.partition("x")
            if not h.isdigit() or not (w.isdigit() or w == ""):
                raise InputError("--models", f"bad input size {size_text!r} in {item!r}: expected 224 or 320x240")
            size = (int(h), int(w or h))
        size = zoo.resolve_size(name, size)  # ZooError (an InputError) for sizes the network cannot take
        sources.append(ModelSource(zoo=name, input_size=size))
    return sources


def parse_shares(text: str) -> list[float]:
    """``0.25,0.5,1.0`` -> [0.25, 0.5, 1.0]; ``InputError`` (field --shares) for anything but numbers in
    (0, 1]."""
    out: list[float] = []
    for t in (t.strip() for t in text.split(",")):
        try:
            x = float(t)
        except ValueError:
            raise InputError("--shares", f"expected comma-separated numbers in (0, 1], got {text!r}") from None
        if not (0.0 < x <= 1.0):  # NaN fails this too
            raise InputError("--shares", f"every share must be in (0, 1] of the device, got {t}")
        if x not in out:
            out.append(x)
    return sorted(out)


def cmd_profile(args: argparse.Namespace) -> int:
    """Measure, print a table (model, batch, mean ms, p95 ms, CV) and write the profile set."""
    from edgemux.runtime.dataplane.backends import make_backend
    from edgemux.runtime.tools.profiler import (check_catalog_name, check_out_dir, host_info, profile_models,
                                          write_profile_set)

    # validate everything before measuring: a typo should cost a second, not minutes of profiling
    if args.backend not in BACKENDS:
        raise UnknownNameError("--backend", args.backend, "backend", list(BACKENDS))
    for opt, value, low in (("--threads", args.threads, 1), ("--warmup", args.warmup, 0),
                            ("--repeats", args.repeats, 1), ("--seed", args.seed, 0)):
        if value < low:
            raise InputError(opt, f"must be >= {low}, got {value}")
    batches = parse_batches(args.batch)
    shares = parse_shares(args.shares) if args.shares is not None else []
    if shares and 1 not in batches:
        raise InputError("--shares", "a share curve is written on the batch-1 row: include 1 in --batch")
    sources = parse_models(args.models, args.backend)
    gpu = args.backend == "cuda"
    kind = DeviceKind.GPU_DISCRETE if gpu else DeviceKind.CPU  # onnxruntime's CUDA or CPU execution provider
    catalog = check_catalog_name(args.catalog if args.catalog is not None else default_catalog_name(kind))
    out = check_out_dir(args.out, args.force)
    backend = make_backend(args.backend, threads=args.threads)  # cuda: one line (503) where there is none
    if gpu and shares:
        from edgemux.runtime.dataplane.gpushare import MPS_CONTROL, mps_pipe_dir, mps_running

        if not mps_running():
            raise InputError("--shares", f"a GPU share is enforced by NVIDIA MPS and no MPS control daemon runs "
                                         f"(no control pipe in {mps_pipe_dir()}): start it with '{MPS_CONTROL} -d'")
    host = host_info(backend)
    # every measurement counts one: each model at each batch size, then at each distinct thread count (CPU) or
    # MPS percentage (GPU) of its share curve
    if shares and gpu:
        from edgemux.runtime.dataplane.gpushare import mps_percentage

        points = len({mps_percentage(sh) for sh in shares})
    elif shares:
        from edgemux.runtime.dataplane.instances import cpu_cores, threads_for

        points = len({threads_for(sh, cpu_cores()) for sh in shares})
    else:
        points = 0
    with progress_for(args, len(sources) * (len(batches) + points), "profile") as bar:
        # minutes may pass: each measurement is also said as a line of its own, on stderr (stdout is the table),
        # in a pipe too
        def progress(m: Any) -> None:
            bar.note(f"  {m.source} batch {m.batch}: mean {m.mean_ms:.3f} ms")
            bar(bar.done + 1)

        measurements = profile_models(backend, sources, batches, args.warmup, args.repeats, seed=args.seed,
                                      progress=progress)
        curves: list[Any] = []
        if shares and gpu:
            from edgemux.runtime.tools.profiler import profile_gpu_share_curves

            def gpu_progress(pct: int, m: Any) -> None:
                bar.note(f"  {m.source} at MPS {pct} %: median {m.p50_ms:.3f} ms")
                bar(bar.done + 1)

            curves = profile_gpu_share_curves(sources, shares, args.warmup, args.repeats, seed=args.seed,
                                              progress=gpu_progress)
        elif shares:
            from edgemux.runtime.tools.profiler import profile_share_curves

            def share_progress(threads: int, m: Any) -> None:
                bar.note(f"  {m.source} at {threads} thread(s): median {m.p50_ms:.3f} ms")
                bar(bar.done + 1)

            curves = profile_share_curves(sources, shares, cpu_cores(), args.warmup, args.repeats,
                                          seed=args.seed, progress=share_progress, backend=args.backend)
    good = {c.source: c.curve for c in curves if c.curve is not None}
    path = write_profile_set(measurements, out, catalog, kind, host, force=args.force, share_curves=good)
    rows = [(m.model, m.variant, m.batch, f"{m.mean_ms:.3f}", f"{m.p95_ms:.3f}", f"{m.cv:.3f}")
            for m in measurements]
    print(render(("MODEL", "VARIANT", "BATCH", "MEAN MS", "P95 MS", "CV"), rows))
    status = 0
    if curves:
        from edgemux.perf.spatial import knee

        print()
        if gpu:
            print("share curves on the GPU (a share runs at MPS active-thread percentage max(1, round(share x 100)) "
                  "in its own process; median of batch-1 runs timed in that process):")
        else:
            print(f"share curves on {curves[0].cores} cores (a share runs max(1, round(share x cores)) threads; "
                  "median of batch-1 runs):")
        curve_rows = [(c.source, f"{sh:g}", t, f"{ms:.3f}") for c in curves for (sh, ms), t in zip(c.points, c.threads)]
        print(render(("MODEL", "SHARE", "MPS %" if gpu else "THREADS", "MEDIAN MS"), curve_rows))
        for c in curves:
            if c.curve is not None:
                print(f"{c.source}: knee at share {knee(c.curve):g} (written to share_curve)")
            else:
                status = 1
                print(f"{c.source}: share curve NOT written: {c.problem}. A larger share did not make it faster "
                      "here (other processes hold cores, or noise): re-run on a quieter host or with more "
                      "--repeats", file=sys.stderr)
    print()
    print(f"wrote profile set {catalog!r} ({len(measurements)} profiles, kind {kind.value}) to {path}")
    print(f"use it with: --profiles {path}  (and 'profiles: {catalog}' on a cpu device)")
    return status
