"""Tests for gradjax.report: grid geometry/pixels, PNG and JSON round trips."""

import json
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from gradjax import report


def _reference_grid(rows, pad, scale):
  """Pixel-by-pixel reference for image_grid."""
  r_, n_, h_, w_, _ = np.shape(rows)
  cell_h, cell_w = h_ * scale + pad, w_ * scale + pad
  out = np.full((r_ * cell_h + pad, n_ * cell_w + pad, 3), 255, dtype=np.uint8)
  for r in range(r_):
    for n in range(n_):
      for y in range(h_ * scale):
        for x in range(w_ * scale):
          v = np.clip(rows[r][n][y // scale, x // scale], 0, 1)
          out[pad + r * cell_h + y, pad + n * cell_w + x] = np.round(255 * v) * np.ones(3)
  return out


def test_grid_geometry_and_pixels():
  rng = np.random.default_rng(0)
  gt = rng.random((3, 2, 5, 3)) * 0.9  # Below 1, so no image pixel is white.
  rec = rng.random((3, 2, 5, 3)) * 0.9
  grid = report.image_grid([gt, rec], pad=2, scale=4)
  assert grid.dtype == np.uint8
  assert grid.shape == (2 * (2 * 4 + 2) + 2, 3 * (5 * 4 + 2) + 2, 3) == (22, 68, 3)
  np.testing.assert_array_equal(grid, _reference_grid([gt, rec], 2, 4))
  # Known positions: corners are padding; row 1, column 2, pixel (1, 4) -> block at
  # y = 2 + 1 * 10 + 1 * 4, x = 2 + 2 * 22 + 4 * 4.
  assert (grid[0, 0] == 255).all() and (grid[-1, -1] == 255).all()
  np.testing.assert_array_equal(grid[16:20, 62:66], np.broadcast_to(np.round(255 * rec[2, 1, 4]), (4, 4, 3)))
  np.testing.assert_array_equal(grid[2, 2], np.round(255 * gt[0, 0, 0]))
  assert (grid[10:12, :] == 255).all()  # Horizontal gap between the rows.
  assert (grid[:, 22:24] == 255).all()  # Vertical gap between columns 0 and 1.


def test_grid_clipping_rounding_and_gray():
  img = np.array([-0.3, 0.0, 0.5, 0.2, 1.0, 1.7]).reshape(1, 2, 3, 1)
  grid = report.image_grid([img], pad=1, scale=1)
  assert grid.shape == (1 * (2 + 1) + 1, 1 * (3 + 1) + 1, 3)
  want = np.array([[0, 0, 128], [51, 255, 255]], dtype=np.uint8)  # round(127.5)=128, round(51.0)=51.
  for c in range(3):  # Gray repeated to RGB.
    np.testing.assert_array_equal(grid[1:3, 1:4, c], want)
  assert report.image_grid([img], pad=0, scale=2).shape == (4, 6, 3)


@pytest.mark.parametrize("rows, kwargs", [
    ([], {}),
    ([np.zeros((2, 4, 4, 3)), np.zeros((2, 4, 4, 1))], {}),
    ([np.zeros((2, 4, 4, 2))], {}),
    ([np.zeros((4, 4, 3))], {}),
    ([np.full((1, 4, 4, 3), np.nan)], {}),
    ([np.zeros((1, 4, 4, 3))], {"scale": 0}),
    ([np.zeros((1, 4, 4, 3))], {"pad": -1}),
])
def test_grid_errors(rows, kwargs):
  with pytest.raises(ValueError):
    report.image_grid(rows, **kwargs)


def test_save_png_round_trip(tmp_path):
  rng = np.random.default_rng(1)
  grid = report.image_grid([rng.random((4, 3, 3, 3)), rng.random((4, 3, 3, 3))])
  path = tmp_path / "a" / "b" / "grid.png"
  report.save_png(path, grid)
  with Image.open(path) as im:
    assert im.format == "PNG" and im.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(im), grid)
  gray = rng.integers(0, 256, (5, 7), dtype=np.uint8)
  report.save_png(str(tmp_path / "gray.png"), gray[..., None])
  with Image.open(tmp_path / "gray.png") as im:
    np.testing.assert_array_equal(np.asarray(im), gray)
  assert sorted(os.listdir(tmp_path / "a" / "b")) == ["grid.png"]  # No temp files left.
  with pytest.raises(ValueError, match="uint8"):
    report.save_png(tmp_path / "bad.png", grid.astype(np.float32))


def test_save_json_round_trip(tmp_path):
  obj = {
      "psnr": np.float32(21.5),
      "n": np.int64(7),
      "ok": np.bool_(True),
      "per_image": np.array([[1.0, 2.0], [3.0, 4.5]]),
      "order": np.array([2, 0, 1]),
      "jax": jnp.arange(3.0),
      "jax_scalar": jnp.float32(0.25),
      "pair": (1, "x"),
      "nested": {3: [np.float64(0.5), None]},
      "b": "text",
  }
  path = tmp_path / "out" / "result.json"
  report.save_json(path, obj)
  text = path.read_text()
  assert json.loads(text) == {
      "psnr": 21.5, "n": 7, "ok": True, "per_image": [[1.0, 2.0], [3.0, 4.5]],
      "order": [2, 0, 1], "jax": [0.0, 1.0, 2.0], "jax_scalar": 0.25, "pair": [1, "x"],
      "nested": {"3": [0.5, None]}, "b": "text",
  }
  assert text.startswith('{\n  "b": "text",\n  "jax"')  # indent=2, sorted keys.
  assert sorted(os.listdir(path.parent)) == ["result.json"]


@pytest.mark.parametrize("obj, where", [
    ({"psnr": float("nan")}, "'psnr'"),
    ({"m": {"per_image": [1.0, np.float32("inf")]}}, "'m.per_image[1]'"),
    ({"arr": np.array([0.0, -np.inf])}, "'arr[1]'"),
    ({"jax": jnp.array([jnp.nan])}, "'jax[0]'"),
])
def test_save_json_non_finite(tmp_path, obj, where):
  path = tmp_path / "r.json"
  path.write_text("{}")
  with pytest.raises(ValueError, match=re.escape(where)):
    report.save_json(path, obj)
  assert path.read_text() == "{}"  # Previous file untouched.
  assert os.listdir(tmp_path) == ["r.json"]


def test_save_json_unsupported(tmp_path):
  with pytest.raises(ValueError, match="'x'"):
    report.save_json(tmp_path / "r.json", {"x": object()})
  with pytest.raises(ValueError, match="key"):
    report.save_json(tmp_path / "r.json", {(1, 2): 0})
  assert not (tmp_path / "r.json").exists()


# --- bar_chart ---------------------------------------------------------------------------------------


def _bar_rows(img, color):
  """Per column, the rows whose pixel is exactly ``color``."""
  mask = np.all(img == np.asarray(color, np.uint8), axis=-1)
  return {x: np.flatnonzero(mask[:, x]).tolist() for x in np.flatnonzero(mask.any(axis=0))}


def test_bar_chart_bars_have_the_expected_height_and_place():
  color = (10, 200, 30)
  labels = ["none", "gaussian:1e-2", "n/a", "over", "under"]
  img = report.bar_chart(labels, [1.0, 2.0, None, 9.0, -1.0], high=4.0, color=color, plot_height=100,
                         bar_width=6, gap=4)
  assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
  assert img.shape[1] == report.CHART_LEFT + 4 + 5 * (6 + 4) + report.CHART_RIGHT
  top = 20  # no title
  y0 = top + 100
  rows = _bar_rows(img, color)
  # 1/4 and 2/4 of 100 rows, no bar for None, clipped to 100 rows above high and 0 below low.
  for i, h in enumerate([25, 50, 0, 100, 0]):
    x0 = report.CHART_LEFT + 4 + i * 10
    for x in range(x0, x0 + 6):
      assert rows.pop(x, []) == list(range(y0 - h, y0)), (i, x)
  assert rows == {}  # nothing else has the bar colour
  assert (img[y0, report.CHART_LEFT:report.CHART_LEFT + 54] == 0).all()  # the black baseline
  # The value is written (black) just above its bar, and the label below the baseline.
  x0 = report.CHART_LEFT + 4 + 10
  assert (img[y0 - 50 - 13:y0 - 50, x0 - 8:x0 + 14] == 0).any()
  assert (img[y0 + 6:, x0 - 2:x0 + 8] == 0).any()


def test_bar_chart_title_auto_range_and_line():
  red = (214, 39, 40)
  img = report.bar_chart(["a", "b"], [3.2, np.nan], title="PSNR", plot_height=50, bar_width=8, gap=2,
                         line=2.5)
  top = 34  # the title takes 14 rows
  y0 = top + 50
  # high = 5 (the smallest 1, 2, 2.5, 5 x 10^k >= 3.2): round(50 * 3.2 / 5) = 32 rows.
  rows = _bar_rows(img, (31, 119, 180))
  x0 = report.CHART_LEFT + 2
  assert sorted(rows) == list(range(x0, x0 + 8))
  line_row = y0 - round(50 * 2.5 / 5)
  bar = set(range(y0 - 32, y0))
  for x in rows:  # the dashed line is drawn over the bars
    assert bar - {line_row} <= set(rows[x]) <= bar
  assert (np.all(img[line_row] == red, axis=-1)).sum() >= 6
  assert (img[:top - 20, :40] == 0).any()  # the title text
  # The line's value counts for the range: a line above every value raises high.
  img2 = report.bar_chart(["a"], [3.0], line=30.0, plot_height=100)
  assert len(_bar_rows(img2, (31, 119, 180))[report.CHART_LEFT + 10]) == round(100 * 3 / 50)


@pytest.mark.parametrize("labels, values, kwargs, message", [
    ([], [], {}, "N >= 1"),
    (["a", "b"], [1.0], {}, "N values"),
    (["a"], [float("inf")], {}, "is inf"),
    (["a"], [1.0], {"low": 2.0, "high": 1.0}, "low < high"),
    (["a"], [1.0], {"bar_width": 0}, "bar_width"),
])
def test_bar_chart_errors(labels, values, kwargs, message):
  with pytest.raises(ValueError, match=message):
    report.bar_chart(labels, values, **kwargs)
