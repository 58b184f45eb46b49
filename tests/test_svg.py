"""Tests for gradjax.run.svg: every drawn point sits where the axes' own tick labels say its value
is (read back from the SVG), the grid's embedded picture is the image grid, each caption under its
column."""

import base64
import io
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from PIL import Image

from gradjax.run import report, svg

NS = {"s": "http://www.w3.org/2000/svg"}


def _text(element) -> str:
  return "\n".join("".join(span.itertext()) for span in element.findall("s:tspan", NS))


def _ticks(panel, cls):
  """(value, position) of a panel's tick labels: x for class xtick, y (baseline - 3.5) for ytick."""
  out = []
  for t in panel.findall("s:text", NS):
    if t.get("class") == cls:
      pos = float(t.get("x")) if cls == "xtick" else float(t.get("y")) - 3.5
      out.append((float(_text(t)), pos))
  return out


def _axis(ticks, log):
  """Position as a function of value, from the first and last tick labels alone."""
  (v0, p0), (v1, p1) = ticks[0], ticks[-1]
  f = math.log10 if log else (lambda v: v)
  return lambda v: p0 + (p1 - p0) * (f(v) - f(v0)) / (f(v1) - f(v0))


def _points(panel):
  return [[tuple(map(float, p.split(","))) for p in line.get("points").split()]
          for line in panel.findall("s:polyline", NS)]


def test_curves_put_each_point_where_the_tick_labels_say():
  history = [{"restart": r, "iteration": it, "loss": loss * (r + 1), "psnr": 10.0 + it / 4 + r}
             for r in range(3) for it, loss in ((0, 1.0), (10, 0.1), (25, 10 ** -1.5), (40, 2e-4))]
  root = ET.fromstring(svg.curves(history, title="t"))
  objective, psnr = root.findall("s:g", NS)
  for panel, key, log in ((objective, "loss", True), (psnr, "psnr", False)):
    xs, ys = _ticks(panel, "xtick"), _ticks(panel, "ytick")
    assert len(xs) >= 3 and len(ys) >= 3
    if log:  # decades, each label a power of ten
      assert all(math.log10(v) == round(math.log10(v)) for v, _ in ys)
    at_x, at_y = _axis(xs, False), _axis(ys, log)
    for v, p in xs:  # every tick on the scale its first and last define
      assert at_x(v) == pytest.approx(p, abs=0.02)
    for v, p in ys:
      assert at_y(v) == pytest.approx(p, abs=0.02)
    lines = _points(panel)
    assert len(lines) == 3
    for r, line in enumerate(lines):
      rows = [h for h in history if h["restart"] == r]
      assert [x for x, _ in line] == pytest.approx([at_x(h["iteration"]) for h in rows], abs=0.01)
      assert [y for _, y in line] == pytest.approx([at_y(h[key]) for h in rows], abs=0.01)
    lo, hi = min(h[key] for h in history), max(h[key] for h in history)
    assert ys[0][0] <= lo and ys[-1][0] >= hi  # the axis covers every value
  legend = [_text(t) for t in root.findall("s:text", NS)]
  assert legend == ["restart 0", "restart 1", "restart 2", "t"]


def test_curves_of_one_run_without_psnr_and_with_a_zero_objective():
  root = ET.fromstring(svg.curves([{"restart": None, "iteration": i, "loss": v}
                                   for i, v in ((1, 0.0), (2, 0.5), (3, 2.0))]))
  (panel,) = root.findall("s:g", NS)
  ys = _ticks(panel, "ytick")
  assert ys[0][0] <= 0.0 and ys[-1][0] >= 2.0  # linear: a zero has no logarithm
  at_y = _axis(ys, False)
  (line,) = _points(panel)
  assert [y for _, y in line] == pytest.approx([at_y(0.0), at_y(0.5), at_y(2.0)], abs=0.01)
  assert not root.findall("s:text", NS)  # one run: no legend


@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (3.0, 3.0), (-7.5, 120.0), (1e-9, 2e-9), (20, 61)])
def test_linear_ticks_are_round_and_cover(lo, hi):
  ticks = svg.linear_ticks(lo, hi)
  assert ticks[0] <= lo and ticks[-1] >= hi and 2 <= len(ticks) <= 8
  steps = np.diff(ticks)
  np.testing.assert_allclose(steps, steps[0], rtol=1e-9)
  mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]))
  assert min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-9


@pytest.mark.parametrize("lo,hi", [(1e-13, 3.0), (0.5, 0.6), (2e-4, 1.0), (1.0, 1.0)])
def test_log_ticks_are_decades_and_cover(lo, hi):
  ticks = svg.log_ticks(lo, hi)
  assert ticks[0] <= lo and ticks[-1] >= hi and 2 <= len(ticks) <= 9
  powers = np.log10(ticks)
  np.testing.assert_allclose(powers, np.round(powers), atol=1e-12)
  assert len(set(np.diff(np.round(powers)))) == 1


def test_reconstruction_embeds_the_grid_and_captions_each_column(photos):
  truth, rec = photos[:3], photos[3:6]
  pad = 2
  grid = report.image_grid([truth, rec], pad=pad, scale=1)
  n, h, w = rec.shape[:3]
  captions = ["PSNR 31.50 dB\nSSIM 0.900", "PSNR 12.25 dB\nSSIM 0.250", "a <b> & c"]
  root = ET.fromstring(svg.reconstruction(grid, (n, h, w), pad, ["ground truth", "reconstruction"],
                                          captions, title="T"))
  (image,) = root.findall("s:image", NS)
  uri = image.get("href")
  assert uri.startswith("data:image/png;base64,")
  with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as im:
    embedded = np.asarray(im)
  scale = embedded.shape[1] // grid.shape[1]  # upscaled by an integer, nearest neighbour
  assert scale >= 2 and embedded.shape == (grid.shape[0] * scale, grid.shape[1] * scale, 3)
  for dy in range(scale):
    for dx in range(scale):
      np.testing.assert_array_equal(embedded[dy::scale, dx::scale], grid)
  assert (float(image.get("width")), float(image.get("height"))) == embedded.shape[1::-1]  # 1:1
  left, top = float(image.get("x")), float(image.get("y"))
  texts = {_text(t): t for t in root.findall("s:text", NS)}
  assert set(texts) == {"ground truth", "reconstruction", "T", *captions}
  for i, caption in enumerate(captions):  # centred under its column, below the grid
    t = texts[caption]
    assert float(t.get("x")) == pytest.approx(left + scale * (pad + i * (w + pad) + w / 2))
    assert float(t.get("y")) > top + float(image.get("height"))
  for r, name in enumerate(["ground truth", "reconstruction"]):  # left of its row, at its middle
    t = texts[name]
    assert float(t.get("y")) == pytest.approx(top + scale * (pad + r * (h + pad) + h / 2))
    assert float(t.get("x")) < left
  assert float(root.get("width")) >= left + float(image.get("width"))
  long = "a title much wider than three small images side by side"
  root = ET.fromstring(svg.reconstruction(grid, (n, h, w), pad, ["a", "b"], title=long))
  (title,) = [t for t in root.findall("s:text", NS) if _text(t) == long]
  assert float(title.get("x")) - 0.3 * 11 * len(long) >= 0  # not cut off
  assert float(title.get("x")) + 0.3 * 11 * len(long) <= float(root.get("width"))


@pytest.mark.parametrize("count,long", [(5, False), (20, True)])
def test_bars_rise_to_their_values_on_the_axis_tick_labels_define(count, long):
  values = [3.5 + 2.25 * k for k in range(count)]
  labels = [f"attack.iterations={100 * k}" if long else str(k) for k in range(count)]
  root = ET.fromstring(svg.bars(labels, values, threshold=20.0, title="t"))
  ys = _ticks(root, "ytick")
  assert ys[0][0] <= 0.0 and ys[-1][0] >= max(values)
  at_y = _axis(ys, False)
  bars = [r for r in root.findall("s:rect", NS) if r.get("class") == "bar"]
  ticks = [t for t in root.findall("s:text", NS) if t.get("class") == "xtick"]
  assert [_text(t) for t in ticks] == labels
  for bar, v, tick in zip(bars, values, ticks, strict=True):
    top, bottom = float(bar.get("y")), float(bar.get("y")) + float(bar.get("height"))
    assert top == pytest.approx(at_y(v), abs=0.01) and bottom == pytest.approx(at_y(0.0), abs=0.01)
    centre = float(bar.get("x")) + float(bar.get("width")) / 2
    assert abs(float(tick.get("x")) - centre) <= 0.35 * 10 + 0.01  # under its bar
    assert ("rotate(-90" in (tick.get("transform") or "")) == long
  (line,) = [l for l in root.findall("s:line", NS) if l.get("stroke-dasharray")]
  assert float(line.get("y1")) == pytest.approx(at_y(20.0), abs=0.01)
