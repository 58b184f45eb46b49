"""gradjax's figures as SVG text: a run's captioned reconstruction grid and objective curves, a
sweep's bars, the defense sweep's bars and scatter side by side.

Written without a plotting library, so that a report is string formatting, not a plotting library's
import and rendering. Text stays text (selectable, sharp at any zoom); images are one embedded PNG,
upscaled by nearest neighbour.

Coordinates are SVG user units (pixels at 100 % zoom), y downwards.
"""

import base64
import html
import io
import math
import re
from typing import Sequence

import numpy as np
from PIL import Image

# matplotlib's "tab10" colours, one per restart (cycled).
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
_FONT = "font-family='sans-serif'"


def _text(x: float, y: float, text: str, size: float = 11, anchor: str = "middle",
          extra: str = "") -> str:
  """One ``<text>``; each line of ``text`` a ``<tspan>`` one line below the last."""
  lines = str(text).split("\n")
  spans = "".join(f"<tspan x='{x:.2f}' dy='{0 if i == 0 else 1.2 * size:.2f}'>{html.escape(line)}"
                  "</tspan>" for i, line in enumerate(lines))
  return (f"<text x='{x:.2f}' y='{y:.2f}' font-size='{size:g}' text-anchor='{anchor}' {_FONT} "
          f"{extra}>{spans}</text>")


def _document(width: float, height: float, body: Sequence[str]) -> str:
  return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
          f"viewBox='0 0 {width:.2f} {height:.2f}'><rect width='100%' height='100%' fill='white'/>"
          + "".join(body) + "</svg>\n")


def png_data_uri(image_uint8: np.ndarray) -> str:
  """``data:image/png;base64,...`` of a uint8 (H, W, 3) image."""
  buffer = io.BytesIO()
  Image.fromarray(np.asarray(image_uint8, np.uint8)).save(buffer, format="PNG")
  return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _width(text: str, size: float) -> float:
  """A generous estimate of a sans-serif line's width (0.6 em per character)."""
  return max((len(line) for line in str(text).split("\n")), default=0) * 0.6 * size


def reconstruction(grid: np.ndarray, shape: tuple[int, int, int], pad: int,
                   row_names: Sequence[str], captions: Sequence[str] | None = None,
                   title: str = "", cell: int = 96) -> str:
  """The image grid with a name left of each row and a caption under each column.

  Args:
    grid: uint8 (R * (H + pad) + pad, N * (W + pad) + pad, 3), :func:`gradjax.run.report.image_grid`
      of R rows at ``scale=1``.
    shape: (N, H, W) of each row.
    pad: the grid's padding in image pixels.
    row_names: R names.
    captions: N captions (lines split at "\\n"), or None.
    cell: about the drawn width of one image in SVG units: the grid is embedded upscaled by the
      integer ``s = max(1, round(cell / W))`` (nearest neighbour, so that every viewer shows the
      pixels) and drawn at 1:1.

  Returns:
    The SVG document: the grid's top-left corner at (``left``, ``top``), tile (r, i) at
    ``left + s (pad + i (W + pad))``, ``top + s (pad + r (H + pad))``.
  """
  n, h, w = shape
  s = max(1, round(cell / w))
  size = 11
  caption_lines = max((len(c.split("\n")) for c in captions), default=0) if captions else 0
  width, height = grid.shape[1] * s, grid.shape[0] * s
  inner = max(width, _width(title, size),
              *(s * (pad + i * (w + pad) + w / 2) + _width(c, size - 1) / 2
                for i, c in enumerate(captions or ())))
  left, top = 1.8 * size, (2.0 * size if title else 0.5 * size)
  body = [f"<image x='{left:.2f}' y='{top:.2f}' width='{width}' height='{height}' "
          f"style='image-rendering:pixelated' "
          f"href='{png_data_uri(np.repeat(np.repeat(grid, s, axis=0), s, axis=1))}'/>"]
  for r, name in enumerate(row_names):
    y = top + s * (pad + r * (h + pad) + h / 2)
    body.append(_text(left - 0.5 * size, y, name, size,
                      extra=f"transform='rotate(-90 {left - 0.5 * size:.2f} {y:.2f})'"))
  for i, caption in enumerate(captions or ()):
    x = left + s * (pad + i * (w + pad) + w / 2)
    body.append(_text(x, top + height + size, caption, size - 1))
  if title:
    body.append(_text(left + inner / 2, 1.3 * size, title, size))
  return _document(left + inner + 0.5 * size,
                   top + height + (caption_lines * 1.2 + 0.6) * (size - 1), body)


def linear_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
  """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi], about ``count``."""
  if not hi > lo:
    lo, hi = lo - 0.5 * max(abs(lo), 1.0), hi + 0.5 * max(abs(hi), 1.0)
  raw = (hi - lo) / max(count - 1, 1)
  power = 10.0 ** math.floor(math.log10(raw))
  step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
  first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
  return [k * step for k in range(first, last + 1)]


def log_ticks(lo: float, hi: float, count: int = 8) -> list[float]:
  """Powers of ten covering [lo, hi] (both > 0), every k-th decade so that at most ``count``."""
  a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
  if a == b:
    a, b = a - 1, b + 1
  every = max(1, math.ceil((b - a) / max(count - 1, 1)))
  a = every * math.floor(a / every)
  return [10.0 ** k for k in range(a, b + every, every)]


def _tick_label(v: float) -> str:
  return f"{v:g}" if v != 0 else "0"


def _axes(x0, y0, width, height, xt, yt, xlabel, ylabel, *, log=False, xlabel_below=30.0):
  """A frame at (x0, y0) of ``width`` x ``height``, grid lines and tick labels (classes ``xtick``,
  ``ytick``) at the values ``xt`` (None: the caller labels x) and ``yt`` (on a log10 scale when
  ``log``), and the axis labels.

  Returns:
    (parts, px, py): the SVG elements, and the maps from an x and a y value to its coordinate.
  """
  f = math.log10 if log else (lambda v: v)

  def px(x):
    return x0 + width * (x - xt[0]) / (xt[-1] - xt[0])

  def py(y):
    return y0 + height * (f(yt[-1]) - f(y)) / (f(yt[-1]) - f(yt[0]))

  parts = [f"<rect x='{x0:.2f}' y='{y0:.2f}' width='{width:.2f}' height='{height:.2f}' "
           "fill='none' stroke='#333' stroke-width='0.8'/>"]
  for t in xt or ():
    parts.append(f"<line x1='{px(t):.2f}' y1='{y0:.2f}' x2='{px(t):.2f}' y2='{y0 + height:.2f}' "
                 "stroke='#ccc' stroke-width='0.6'/>")
    parts.append(_text(px(t), y0 + height + 13, _tick_label(t), 10, extra="class='xtick'"))
  for t in yt:
    parts.append(f"<line x1='{x0:.2f}' y1='{py(t):.2f}' x2='{x0 + width:.2f}' y2='{py(t):.2f}' "
                 "stroke='#ccc' stroke-width='0.6'/>")
    parts.append(_text(x0 - 4, py(t) + 3.5, _tick_label(t), 10, anchor="end",
                       extra="class='ytick'"))
  parts.append(_text(x0 + width / 2, y0 + height + xlabel_below, xlabel, 11))
  parts.append(_text(x0 - 48, y0 + height / 2, ylabel, 11,
                     extra=f"transform='rotate(-90 {x0 - 48:.2f} {y0 + height / 2:.2f})'"))
  return parts, px, py


def _panel(series, x0, y0, width, height, xlabel, ylabel, log):
  """One set of axes at (x0, y0) of ``width`` x ``height``: ``series`` is [(label, colour, xs, ys)]."""
  xs = [x for _, _, sx, _ in series for x in sx]
  ys = [y for _, _, _, sy in series for y in sy]
  out, px, py = _axes(x0, y0, width, height, linear_ticks(min(xs), max(xs)),
                      log_ticks(min(ys), max(ys)) if log else linear_ticks(min(ys), max(ys)),
                      xlabel, ylabel, log=log)
  for label, colour, sx, sy in series:
    points = " ".join(f"{px(x):.3f},{py(y):.3f}" for x, y in zip(sx, sy))
    out.append(f"<polyline points='{points}' fill='none' stroke='{colour}' stroke-width='1.5'>"
               f"<title>{html.escape(label)}</title></polyline>")
    out += [f"<circle cx='{px(x):.3f}' cy='{py(y):.3f}' r='1.8' fill='{colour}'/>"
            for x, y in zip(sx, sy)]
  return out


def curves(history: Sequence[dict], title: str = "") -> str:
  """The objective against iterations (log scale when every value is positive) and, where recorded,
  the PSNR: one line per restart, a legend for 2 to 8 of them.

  Args:
    history: rows ``{"restart", "iteration", "loss"[, "psnr"]}``
      (:class:`gradjax.run.pipeline.Trace`); ``restart`` None for the best over all restarts.

  Returns:
    The SVG document: one panel (class ``panel``) per quantity, polylines in the history's order;
    tick labels (classes ``xtick``, ``ytick``) sit at their values' positions on the axes.
  """
  runs: dict = {}
  for r in history:
    runs.setdefault(r["restart"], []).append(r)
  with_psnr = any("psnr" in r for r in history)
  losses, psnrs = [], []
  for k, (restart, rows) in enumerate(runs.items()):
    label = "all restarts" if restart is None else f"restart {restart}"
    colour = COLOURS[k % len(COLOURS)]
    losses.append((label, colour, [r["iteration"] for r in rows], [r["loss"] for r in rows]))
    pts = [(r["iteration"], r["psnr"]) for r in rows if "psnr" in r]
    if pts:
      psnrs.append((label, colour, *map(list, zip(*pts))))
  log = all(v > 0 for _, _, _, ys in losses for v in ys)
  width, height, left, top = 330.0, 200.0, 62.0, 30.0 if title else 12.0
  panels = [("objective (best so far)", losses, log)]
  if with_psnr and psnrs:
    panels.append(("PSNR of the best iterate (dB)", psnrs, False))
  body = []
  for p, (ylabel, series, is_log) in enumerate(panels):
    x0 = left + p * (width + left + 10)
    body.append("<g class='panel'>")
    body += _panel(series, x0, top, width, height, "iteration", ylabel, is_log)
    body.append("</g>")
  if 1 < len(losses) <= 8:
    body.append(f"<rect x='{left + width - 92:.2f}' y='{top + 2:.2f}' width='88' "
                f"height='{14 * len(losses) + 4}' fill='white' fill-opacity='0.85'/>")
    for k, (label, colour, _, _) in enumerate(losses):
      y = top + 12 + 14 * k
      body.append(f"<line x1='{left + width - 88:.2f}' y1='{y - 3.5:.2f}' x2='{left + width - 72:.2f}' "
                  f"y2='{y - 3.5:.2f}' stroke='{colour}' stroke-width='2'/>")
      body.append(_text(left + width - 68, y, label, 10, anchor="start"))
  total = left + len(panels) * (width + left + 10)
  if title:
    body.append(_text(total / 2, 16, title, 11))
  return _document(total, top + height + 40, body)


def bars(labels: Sequence[str], values: Sequence[float], threshold: float | None = None,
         title: str = "", ylabel: str = "PSNR (dB)", *, xlabel: str = "experiment",
         threshold_label: str | None = None, hatched: Sequence[bool] | None = None) -> str:
  """One bar per value from zero, labelled below (turned upright when there are more than 12 or
  they are long), ``threshold`` as a dashed line (labelled ``threshold_label``, default "T dB"),
  and the bars that ``hatched`` marks hatched.

  Returns:
    The SVG document: bar k (class ``bar``, ``bar hatched`` where marked) centred at tick label k's
    x; its top where the y tick labels (class ``ytick``) place its value.
  """
  values = [float(v) for v in values]
  hatched = list(hatched) if hatched is not None else [False] * len(values)
  n, size = len(values), 10
  widest = max((_width(label, size) for label in labels), default=0.0)
  turned = n > 12 or widest > 30
  below = (0.92 * widest + 8 if turned else 16) + 24
  width = max(240.0, 30.0 * n, _width(threshold_label or "", size) + 20)
  height, left, top = 200.0, 62.0, 30.0 if title else 12.0
  yt = linear_ticks(min(0.0, *values), max(0.0, *values, *([threshold] if threshold is not None
                                                                  else [])))
  axes, _, py = _axes(left, top, width, height, None, yt, xlabel, ylabel, xlabel_below=below - 6)
  body = ["<defs><pattern id='hatch' width='6' height='6' patternUnits='userSpaceOnUse' "
          "patternTransform='rotate(45)'><line x1='0' y1='0' x2='0' y2='6' stroke='white' "
          "stroke-width='2'/></pattern></defs>", *axes]
  step = width / max(n, 1)
  for k, (label, v, hatch) in enumerate(zip(labels, values, hatched, strict=True)):
    x = left + step * (k + 0.5)
    box = (f"x='{x - 0.35 * step:.3f}' y='{min(py(v), py(0.0)):.3f}' width='{0.7 * step:.3f}' "
           f"height='{abs(py(0.0) - py(v)):.3f}'")
    body.append(f"<rect class='bar{' hatched' if hatch else ''}' {box} fill='{COLOURS[0]}'>"
                f"<title>{html.escape(str(label))}: {v:.2f}</title></rect>")
    if hatch:
      body.append(f"<rect {box} fill='url(#hatch)'/>")
    if turned:  # read upwards, its end under the bar (the baseline's offset centres it)
      tx, ty = x + 0.35 * size, top + height + 6
      body.append(_text(tx, ty, str(label), size, anchor="end",
                        extra=f"transform='rotate(-90 {tx:.2f} {ty:.2f})' class='xtick'"))
    else:
      body.append(_text(x, top + height + 13, str(label), size, extra="class='xtick'"))
  if threshold is not None:
    body.append(f"<line class='threshold' x1='{left:.2f}' y1='{py(threshold):.3f}' "
                f"x2='{left + width:.2f}' y2='{py(threshold):.3f}' stroke='{COLOURS[3]}' "
                "stroke-dasharray='5 3' stroke-width='1'/>")
    body.append(_text(left + width - 4, py(threshold) - 4,
                      threshold_label or f"{threshold:g} dB", size, anchor="end"))
  if title:
    body.append(_text((left + width) / 2, 16, title, 11))
  return _document(max(left + width + 10, _width(title, 11) + 20), top + height + below, body)


def scatter(points: Sequence[tuple[float, float, str]], xlabel: str, ylabel: str,
            vline: float | None = None) -> str:
  """Labelled points (x, y, label) on linear axes, ``vline`` as a dashed vertical line.

  Returns:
    The SVG document: point k (class ``point``) where the tick labels (classes ``xtick``,
    ``ytick``) place (x_k, y_k), its label beside it.
  """
  xs = [p[0] for p in points] + ([vline] if vline is not None else [])
  ys = [p[1] for p in points]
  xt = linear_ticks(min(xs, default=0.0), max(xs, default=1.0))
  yt = linear_ticks(min(ys, default=0.0), max(ys, default=1.0))
  width, height, left, top = 300.0, 200.0, 62.0, 12.0
  body, px, py = _axes(left, top, width, height, xt, yt, xlabel, ylabel)
  if vline is not None:
    body.append(f"<line x1='{px(vline):.3f}' y1='{top:.2f}' x2='{px(vline):.3f}' "
                f"y2='{top + height:.2f}' stroke='{COLOURS[3]}' stroke-dasharray='5 3' "
                "stroke-width='1'/>")
  for x, y, label in points:
    body.append(f"<circle class='point' cx='{px(x):.3f}' cy='{py(y):.3f}' r='3' "
                f"fill='{COLOURS[1]}'/>")
    body.append(_text(px(x) + 4, py(y) - 4, label, 8, anchor="start"))
  return _document(left + width + 40, top + height + 40, body)


def side_by_side(documents: Sequence[str], gap: float = 10.0) -> str:
  """Documents of this module next to each other, tops aligned, as one document (each nested
  as an ``<svg>`` at its x offset)."""
  sizes = [tuple(float(v) for v in re.match(r"<svg [^>]*width='([\d.]+)' height='([\d.]+)'",
                                             d).groups()) for d in documents]
  body, x = [], 0.0
  for document, (w, _) in zip(documents, sizes):
    body.append(document.strip().replace("<svg ", f"<svg x='{x:.2f}' y='0' ", 1))
    x += w + gap
  return _document(x - gap, max(h for _, h in sizes), body)
