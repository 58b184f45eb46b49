"""Tests for gradjax.run.report: grid geometry/pixels, PNG and JSON round trips."""

import json
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from gradjax.run import report, svg


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


# --- figures, CSV and the HTML report --------------------------------------------------------------

def test_save_csv_round_trips(tmp_path):
  import csv
  rows = [{"index": 0, "psnr": 31.25, "lpips": None}, {"index": 1, "psnr": 12.5, "extra": "x"}]
  report.save_csv(tmp_path / "r.csv", rows, ["index", "psnr", "lpips"])
  with open(tmp_path / "r.csv", newline="") as fh:
    got = list(csv.DictReader(fh))
  assert got == [{"index": "0", "psnr": "31.25", "lpips": ""}, {"index": "1", "psnr": "12.5", "lpips": ""}]


def test_html_report_is_self_contained(tmp_path, photos):
  import base64
  import html.parser
  results = {"psnr_per_image": [31.5, 12.25], "ssim_per_image": [0.9, 0.25], "lpips_per_image": None}
  captions = report.per_image_captions(results)
  assert captions == ["PSNR 31.50 dB\nSSIM 0.900", "PSNR 12.25 dB\nSSIM 0.250"]
  report.save_png(tmp_path / "grid.png", report.image_grid([photos[:2], photos[2:4]]))
  report.write_svg(tmp_path / "curves.svg", svg.curves(
      [{"restart": 0, "iteration": 10, "loss": 1.0, "psnr": 9.0},
       {"restart": 0, "iteration": 20, "loss": 0.5}], "t"))
  figures = {"grid": str(tmp_path / "grid.png"), "curves": str(tmp_path / "curves.svg")}
  report.html_report(tmp_path / "r.html", "A <title>", {"psnr": 21.875}, [{"image": 0, "psnr": 31.5}],
                     figures, {"seed": 3})
  page = (tmp_path / "r.html").read_text()
  assert "A &lt;title&gt;" in page and "21.88" in page and "31.5" in page and "&quot;seed&quot;: 3" in page

  class Images(html.parser.HTMLParser):
    def __init__(self):
      super().__init__()
      self.sources = []

    def handle_starttag(self, tag, attrs):
      if tag == "img":
        self.sources.append(dict(attrs)["src"])

  parser = Images()
  parser.feed(page)
  assert len(parser.sources) == 2
  for src, file, mime in zip(parser.sources, figures.values(), ("image/png", "image/svg+xml")):
    assert src.startswith(f"data:{mime};base64,")
    assert base64.b64decode(src.split(",", 1)[1]) == open(file, "rb").read()


def test_run_report_leads_with_the_verdict(tmp_path, photos):
  """report.html: the verdict first, every number with its unit, why LPIPS is absent, the checks,
  the residual per layer and how the run was made; without ground truth no PSNR curve."""
  results = {"verdict": {"status": "inconclusive", "reason": "R<1>"}, "psnr": 12.5, "ssim": 0.25,
             "psnr_per_image": [12.5], "ssim_per_image": [0.25], "lpips_absent": "L<2>",
             "loss": 0.5, "iterations": 10, "wall_time_s": 1.5, "command": "python x.py --a=1",
             "jax": "0.10.2", "history": [{"restart": 0, "iteration": 10, "loss": 0.5}],
             "residual": {"relative_error": 0.25, "layers": {"['head']['kernel']": {
                 "relative_error": 0.25, "cosine": 0.9}}},
             "checks": {"activation": {"declared": "sigmoid", "ok": False, "explained": "A<3>"}},
             "time": {"phases": {"attack": {"seconds": 1.5, "making_programs": 0.625, "tracing": 0.125,
                                            "lowering": 0.25, "compiling": 0.375}},
                      "largest_programs": [{"name": "jit(P<4>)", "tracing": 0.125, "lowering": 0.25,
                                            "compiling": 0.375, "cached": True, "seconds": 0.75}]}}
  report.write_run(str(tmp_path), results, {"reconstruction": photos[:1], "ground_truth": photos[1:2]},
                   "t")
  page = (tmp_path / "report.html").read_text()
  assert page.index("inconclusive") < page.index("12.5 dB") < page.index("1.5 s")
  for text in ("R&lt;1&gt;", "L&lt;2&gt;", "A&lt;3&gt;", "python x.py --a=1", "0.10.2", "0.9",
               "jit(P&lt;4&gt;)", "0.625", "0.375"):
    assert text in page
  out = tmp_path / "no_truth"
  report.write_run(str(out), {**results, "psnr_per_image": None, "ssim_per_image": None, "psnr": None,
                              "ssim": None}, {"reconstruction": photos[:1]}, "t")
  page = (out / "report.html").read_text()
  headings = [h.split("</h2>")[0] for h in page.split("<h2>")[1:]]
  assert not any("PSNR" in h for h in headings) and "<th>PSNR</th>" not in page
