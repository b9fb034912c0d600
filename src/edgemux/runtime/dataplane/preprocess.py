"""Client-side pre-processing of camera frames into a model's input tensor.

MicroEdge's TPU Client resizes frames on the client before sending them, so that the shared accelerator
(and the network) only ever carries the model's input size; edgemux's client does the same. One function,
:func:`to_model_input`, takes an image as it comes from a camera or a decoder (height × width × channels)
and returns exactly what the model's declared input (:class:`~edgemux.runtime.dataplane.protocol.TensorSpec`) wants:

1. resize to the model's input height × width (bilinear with half-pixel centres, as OpenCV's
   ``INTER_LINEAR``; no anti-aliasing, so heavy downscaling aliases exactly as it does for OpenCV clients);
2. lay out channels-first (NCHW) when the spec's shape says so, else keep channels-last (NHWC);
3. scale: ``FP32``/``FP16`` inputs get values in [0, 1]; ``UINT8`` inputs (Edge TPU models) keep 0..255;
   ``INT8`` inputs (full-integer TFLite models) get the pixels shifted into -128..127, the TFLite converter's
   convention (an INT8 model's input has its UINT8 twin's scale and a zero point 128 lower, so the same
   real value is fed);
4. add the batch dimension (a batch of one frame).

Errors are :class:`ValueError` in Triton's style, naming what was expected and what came.
"""

from __future__ import annotations

import numpy as np

from edgemux.runtime.dataplane.protocol import TensorSpec

# Datatypes an image can be turned into.
_IMAGE_DATATYPES = ("UINT8", "INT8", "FP16", "FP32")
# Channel counts we recognise in a spec's shape: grayscale and RGB.
_CHANNELS = (1, 3)


def to_model_input(image: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Turn one image into a batch of one for the model input ``spec``.

    ``image`` is (H, W, C) or (H, W) (grayscale, C = 1), ``uint8`` in 0..255 or floating point taken to be
    in [0, 1] already (it is not rescaled, only clipped when converted to ``UINT8``). ``spec.shape`` must be
    rank 4 with the batch first: ``[-1 or 1, C, H, W]`` (channels-first) or ``[-1 or 1, H, W, C]``
    (channels-last), C being 1 or 3; an H or W of -1 (variable) keeps the image's size. When both
    ``shape[1]`` and ``shape[3]`` could be the channels (e.g. ``[1,3,224,3]``), channels-last wins.

    Returns a C-contiguous array of ``spec.shape`` with the batch dimension 1 and the dtype of
    ``spec.datatype`` (``uint8``, ``int8``, ``float16`` or ``float32``).
    """
    image = np.asarray(image)
    where = f"input '{spec.name}'"
    if spec.datatype not in _IMAGE_DATATYPES:
        raise ValueError(
            f"{where}: unexpected datatype for an image input: expected one of {', '.join(_IMAGE_DATATYPES)}, "
            f"got {spec.datatype}"
        )
    channels_first, batch, channels, height, width = _layout(spec)
    if batch not in (-1, 1):
        raise ValueError(
            f"{where}: unexpected batch size: to_model_input makes a batch of 1, the model expects {batch}"
        )

    if image.ndim == 2:
        image = image[:, :, None]  # grayscale frame: one channel
    if image.ndim != 3:
        raise ValueError(
            f"{where}: unexpected image rank: expected 3 (height, width, channels) or 2 (grayscale), "
            f"got {image.ndim} with shape {_fmt(image.shape)}"
        )
    if image.shape[2] != channels:
        raise ValueError(
            f"{where}: unexpected number of image channels: expected {channels}, got {image.shape[2]} "
            f"(image shape {_fmt(image.shape)})"
        )
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"{where}: empty image of shape {_fmt(image.shape)}")
    if image.dtype == np.uint8:
        is_uint8 = True
    elif np.issubdtype(image.dtype, np.floating):
        is_uint8 = False
    else:
        raise ValueError(f"{where}: unexpected image dtype: expected uint8 or floating point, got {image.dtype}")

    out_h = image.shape[0] if height == -1 else height
    out_w = image.shape[1] if width == -1 else width
    same_size = (out_h, out_w) == image.shape[:2]

    if spec.datatype == "UINT8" and is_uint8 and same_size:
        pixels = image  # exact pass-through: no float round trip for the common Edge TPU case
    else:
        # Work in [0, 1] floats: resizing uint8 in integers would round twice.
        unit = image.astype(np.float32) / np.float32(255.0) if is_uint8 else image.astype(np.float32)
        if not same_size:
            unit = resize_bilinear(unit, out_h, out_w)
        if spec.datatype in ("UINT8", "INT8"):
            pixels = np.clip(np.rint(unit * np.float32(255.0)), 0, 255).astype(np.uint8)
        else:
            pixels = unit.astype(np.float16 if spec.datatype == "FP16" else np.float32)
    if spec.datatype == "INT8":
        pixels = (pixels.astype(np.int16) - 128).astype(np.int8)  # 0..255 -> -128..127: the same real values

    if channels_first:
        pixels = pixels.transpose(2, 0, 1)  # HWC -> CHW
    return np.ascontiguousarray(pixels[None, ...])


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize an (H, W, C) float image to ``height`` × ``width`` pixels by bilinear interpolation.

    Pixel centres are at half-integers (OpenCV ``INTER_LINEAR``, PyTorch ``align_corners=False``): output
    pixel ``j`` samples the source at ``x = (j + 0.5) · W / width - 0.5``, clamped to the image, so that
    a linear gradient stays the same linear gradient. Returns float32.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"resize target must be positive, got {height}x{width}")
    src = np.asarray(image, dtype=np.float32)
    y0, y1, wy = _taps(src.shape[0], height)
    x0, x1, wx = _taps(src.shape[1], width)
    # Separable: interpolate rows first (fewer rows when downscaling), then columns.
    rows = src[y0] * (1.0 - wy)[:, None, None] + src[y1] * wy[:, None, None]
    out = rows[:, x0] * (1.0 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]
    return out.astype(np.float32, copy=False)


def _taps(src_size: int, dst_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output index: the two source indices and the weight of the second one."""
    scale = src_size / dst_size
    pos = (np.arange(dst_size, dtype=np.float64) + 0.5) * scale - 0.5
    pos = np.clip(pos, 0.0, src_size - 1)  # border pixels replicate, as OpenCV's BORDER_REPLICATE
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, src_size - 1)
    return lo, hi, (pos - lo).astype(np.float32)


def _layout(spec: TensorSpec) -> tuple[bool, int, int, int, int]:
    """(channels_first, batch, channels, height, width) from a rank-4 image spec."""
    shape = spec.shape
    where = f"input '{spec.name}'"
    if len(shape) != 4:
        raise ValueError(
            f"{where}: unexpected model input rank for an image: expected 4 (batch, then CHW or HWC), "
            f"got {len(shape)} with shape {_fmt(shape)}"
        )
    batch = shape[0]
    # Channels-last is checked first: a [N,H,W,3] spec is the Edge TPU / TFLite convention, and a spec
    # [N,3,H,3] is ambiguous only for 3-pixel-wide images, which no vision model takes.
    if shape[3] in _CHANNELS:
        return False, batch, shape[3], shape[1], shape[2]
    if shape[1] in _CHANNELS:
        return True, batch, shape[1], shape[2], shape[3]
    raise ValueError(
        f"{where}: cannot tell the channel dimension of shape {_fmt(shape)}: expected "
        f"[N,C,H,W] or [N,H,W,C] with C in {{1,3}}"
    )


def _fmt(shape: tuple[int, ...]) -> str:
    """Triton's way of printing a shape: ``[1,3,224,224]``."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def dequantize(array: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """A quantized tensor's real values, ``scale * (q - zero_point)`` (float32): an INT8/UINT8 model's
    outputs read with the scale and zero point its model metadata gives each tensor (``parameters``
    ``{"quantization": {"scale": s, "zero_point": z}}``; ``ModelMetadata.quantization``)."""
    if not (isinstance(scale, (int, float)) and scale > 0 and np.isfinite(scale)):
        raise ValueError(f"dequantize: scale must be a finite number > 0, got {scale!r}")
    return (np.float32(scale) * (np.asarray(array).astype(np.float32) - np.float32(zero_point))).astype(np.float32)
