"""Host-side reporting: image grids, PNG files and strict JSON files.

``image_grid`` lays out batches of [0, 1] images (e.g. ``[ground_truth,
reconstruction]``) one batch per row; ``save_png`` writes it; ``save_json``
writes results with numpy/JAX values converted to Python types and refuses
NaN/inf, so a non-finite metric never leaks silently into a results file.
Both writers create parent directories and replace the target atomically.
"""

import json
import math
import os
from typing import Any, Sequence

import numpy as np
from PIL import Image

from gradjax.files import atomic_write
from gradjax.run import svg


def image_grid(rows: Sequence[np.ndarray], pad: int = 2, scale: int = 4) -> np.ndarray:
  """Tiles R batches of N images into one RGB uint8 image.

  Row r, column n holds ``rows[r][n]``, upscaled ``scale`` times with nearest
  neighbour (``np.repeat``), at top-left corner
  ``(pad + r * (H * scale + pad), pad + n * (W * scale + pad))``; everything
  else is white. Values are clipped to [0, 1] and mapped by
  ``round(255 * v)``; gray (C = 1) is repeated to RGB.

  Args:
    rows: R arrays of identical shape (N, H, W, C), C in {1, 3}.
    pad: white border width in output pixels, >= 0.
    scale: integer upscale factor, >= 1.

  Returns:
    uint8 array of shape (R * (H * scale + pad) + pad, N * (W * scale + pad) + pad, 3).
  """
  if len(rows) == 0:
    raise ValueError("image_grid needs at least one row.")
  if int(pad) != pad or pad < 0 or int(scale) != scale or scale < 1:
    raise ValueError(f"Need integer pad >= 0 and scale >= 1, got pad={pad}, scale={scale}.")
  pad, scale = int(pad), int(scale)
  rows = [np.asarray(r, dtype=np.float64) for r in rows]
  shape = rows[0].shape
  if len(shape) != 4 or shape[3] not in (1, 3) or 0 in shape:
    raise ValueError(f"Rows must be non-empty (N, H, W, C) with C in {{1, 3}}, got {shape}.")
  for i, r in enumerate(rows):
    if r.shape != shape:
      raise ValueError(f"Row {i} has shape {r.shape}, row 0 has {shape}.")
    if not np.all(np.isfinite(r)):
      raise ValueError(f"Row {i} contains NaN or inf.")
  n, h, w, c = shape
  cell_h, cell_w = h * scale + pad, w * scale + pad
  grid = np.full((len(rows) * cell_h + pad, n * cell_w + pad, 3), 255, dtype=np.uint8)
  for i, r in enumerate(rows):
    tiles = np.round(255.0 * np.clip(r, 0.0, 1.0)).astype(np.uint8)
    tiles = np.repeat(np.repeat(tiles, scale, axis=1), scale, axis=2)
    tiles = np.broadcast_to(tiles, (n, h * scale, w * scale, 3))
    top = pad + i * cell_h
    for j in range(n):
      left = pad + j * cell_w
      grid[top:top + h * scale, left:left + w * scale] = tiles[j]
  return grid


def save_png(path, image_uint8: np.ndarray) -> None:
  """Saves a uint8 (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) image as PNG."""
  img = np.asarray(image_uint8)
  if img.dtype != np.uint8:
    raise ValueError(f"save_png expects uint8, got {img.dtype}.")
  if img.ndim == 3 and img.shape[2] == 1:
    img = img[:, :, 0]
  if not (img.ndim == 2 or (img.ndim == 3 and img.shape[2] in (3, 4))) or img.size == 0:
    raise ValueError(f"save_png expects a non-empty (H, W[, 1|3|4]) image, got {img.shape}.")
  pil = Image.fromarray(img)
  atomic_write(path, lambda f: pil.save(f, format="PNG"), binary=True)


def write_svg(path, document: str) -> None:
  """Writes an SVG document (:mod:`gradjax.run.svg`) atomically."""
  atomic_write(path, lambda f: f.write(document), binary=False)


def _to_python(obj: Any, key: str) -> Any:
  """Recursively converts numpy/JAX values to JSON types; ``key`` locates obj for errors."""
  if obj is None or isinstance(obj, (bool, str)):
    return obj
  if isinstance(obj, (int, float)):  # Includes np.float64 (a float subclass).
    if isinstance(obj, float) and not math.isfinite(obj):
      raise ValueError(f"Non-finite value {obj} at key '{key}'.")
    return float(obj) if isinstance(obj, float) else int(obj)
  if isinstance(obj, dict):
    out = {}
    for k, v in obj.items():
      if isinstance(k, (np.integer, np.str_)):
        k = k.item()
      if not isinstance(k, (str, int)) or isinstance(k, bool):
        raise ValueError(f"Unsupported dict key {k!r} ({type(k).__name__}) under '{key}'.")
      out[str(k)] = _to_python(v, f"{key}.{k}" if key else str(k))
    return out
  if isinstance(obj, (list, tuple)):
    return [_to_python(v, f"{key}[{i}]") for i, v in enumerate(obj)]
  if isinstance(obj, np.generic) or hasattr(obj, "__array__"):  # numpy scalars/arrays, jax arrays.
    arr = np.asarray(obj)
    if arr.dtype.kind not in "biuf":
      raise ValueError(f"Unsupported array dtype {arr.dtype} at key '{key}'.")
    if arr.ndim == 0:
      return _to_python(arr.item(), key)
    return [_to_python(v, f"{key}[{i}]") for i, v in enumerate(arr.tolist())]
  raise ValueError(f"Unsupported type {type(obj).__name__} at key '{key}'.")


def save_csv(path, rows: Sequence[dict], columns: Sequence[str]) -> None:
  """Writes ``rows`` (dicts) as CSV with a header of ``columns`` (missing values empty), atomically."""
  import csv

  def write(f):
    w = csv.writer(f, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
      w.writerow(["" if r.get(c) is None else r.get(c) for c in columns])

  atomic_write(path, write, binary=False)


def save_json(path, obj: Any) -> None:
  """Writes ``obj`` as JSON (indent 2, sorted keys), atomically.

  numpy scalars/arrays and JAX arrays become Python numbers/lists; tuples
  become lists; dict keys must be str or int. NaN/inf anywhere raise
  ``ValueError`` naming the key path (e.g. ``metrics.psnr_per_image[3]``);
  nothing is written then.
  """
  data = _to_python(obj, "")

  def write(f):
    json.dump(data, f, indent=2, sort_keys=True, allow_nan=False)
    f.write("\n")

  atomic_write(path, write, binary=False)


def summarize(rows: list[dict], threshold: float) -> dict:
  """Mean, population std and median of each metric over experiments; successes at ``threshold`` dB;
  ``recognisable`` of ``images``: the images the verdict's rule calls recognisable (where every row
  has ``findings``).

  ``rows`` are :func:`gradjax.run.pipeline.run` results (keys psnr, ssim, mse, wall_time_s,
  iterations; label_accuracy, lpips and psnr_unclamped summarised when every row has them);
  ``leaks``, ``no_leak_found`` and ``inconclusive``: the rows whose verdict (:mod:`gradjax.verdict`)
  is each.
  """
  out = {"experiments": len(rows), "psnr_threshold": threshold}
  keys = ["psnr", "ssim", "mse", "wall_time_s", "iterations"]
  if rows and all(r.get("label_accuracy") is not None for r in rows):
    keys.insert(3, "label_accuracy")
  if rows and all(r.get("lpips") is not None for r in rows):
    keys.insert(2, "lpips")
  if rows and all(r.get("psnr_unclamped") is not None for r in rows):
    keys.insert(1, "psnr_unclamped")
  for key in keys:
    v = np.array([r[key] for r in rows], np.float64)
    out[key] = {"mean": float(v.mean()), "std": float(v.std()), "median": float(np.median(v))}
  out["successes"] = int(sum(r["psnr"] >= threshold for r in rows))
  images = [(r.get("findings") or {}).get("images") for r in rows]
  if rows and all(images):  # the verdict's rule (gradjax.verdict.image_findings)
    out["recognisable"] = int(sum(i["recognisable"] for i in images))
    out["images"] = int(sum(i["of"] for i in images))
  statuses = [(r.get("verdict") or {}).get("status") for r in rows]
  out["leaks"] = statuses.count("leak")
  out["no_leak_found"], out["inconclusive"] = statuses.count("no_leak_found"), statuses.count("inconclusive")
  return out


# --- the HTML report (its figures: gradjax.run.svg) ---------------------------------------------

def per_image_captions(results: dict) -> list[str]:
  """One caption per image from a results dict: PSNR, SSIM and LPIPS where present, and whether the
  verdict's rule calls it recognisable."""
  n = len(results.get("psnr_per_image") or results.get("labels_by_slot") or [])
  captions = []
  for i in range(n):
    parts = []
    for key, fmt in (("psnr_per_image", "PSNR {:.2f} dB"), ("ssim_per_image", "SSIM {:.3f}"),
                     ("lpips_per_image", "LPIPS {:.3f}")):
      if results.get(key) is not None:
        parts.append(fmt.format(results[key][i]))
    images = (results.get("findings") or {}).get("images")
    if images:
      parts.append("recognisable" if images["per_image"][i]["recognisable"] else "not recognisable")
    captions.append("\n".join(parts))
  return captions


def _cell(value) -> str:
  import html
  if isinstance(value, float):
    return f"{value:.4g}"
  return html.escape(str(value))


# What a run's numbers are: key -> (label, unit, meaning). The report prints each beside its value.
QUANTITIES = {
    "psnr": ("PSNR", "dB", "peak signal-to-noise ratio of the reconstruction against the client's "
             "image, images clamped to [0, 1], mean over images; higher is closer (20 dB: an error "
             "of 0.1 per pixel)"),
    "psnr_unclamped": ("PSNR unclamped", "dB", "the PSNR of the reconstruction as the attack left "
                       "it, pixels outside [0, 1] kept, as the Inverting Gradients code scores; "
                       "below PSNR when the attack leaves the image's range"),
    "ssim": ("SSIM", "", "structural similarity (scikit-image's), mean over images; 1 is identical, "
             "0 unrelated"),
    "lpips": ("LPIPS", "", "learned perceptual distance (AlexNet, v0.1), mean over images; 0 is "
              "identical, lower is closer"),
    "mse": ("MSE", "", "mean squared pixel error on [0, 1] images"),
    "label_accuracy": ("label accuracy", "", "share of the client's labels recovered (as a "
                       "multiset)"),
    "token_accuracy": ("token accuracy", "", "share of tokens recovered in place (the optimisation "
                       "attacks' by the pseudo-inverse decoding)"),
    "bag_recall": ("bag-of-words recall", "", "share of the sentences' tokens recovered anywhere"),
    "word_recall": ("word recall", "", "share of the sentences' tokens whose word is among the "
                    "words found without their places (the span attack's position sets)"),
    "word_recall_chance": ("word recall of a guess", "", "that of the corpus's as many most "
                           "frequent words: the bar a set of words found is measured against"),
    "rouge1": ("ROUGE-1", "", "unigram F-measure of each recovered sentence against its true one, "
               "mean over the true sentences (0 for one without a recovered sentence)"),
    "rouge2": ("ROUGE-2", "", "bigram F-measure, likewise"),
    "rougeL": ("ROUGE-L", "", "longest-common-subsequence F-measure, likewise"),
    "loss": ("objective", "", "the attack's objective at its best iterate (its distance to the "
             "update, plus priors)"),
    "residual": ("relative residual", "", "‖α·u − c‖ / ‖c‖: how far the update of the "
                 "reconstruction (u, at the best scale α) is from the observed one (c); 0 is a "
                 "perfect match"),
    "privacy": ("DP-SGD ε", "", "the client's DP-SGD guarantee over its training, (ε, δ)-DP from "
                "the Rényi DP of the sampled Gaussian mechanism (gradjax.privacy); smaller is more "
                "private, and says nothing of what this attack recovered"),
    "iterations": ("iterations", "", "optimizer iterations of the best restart"),
    "evaluations": ("evaluations", "", "objective evaluations over all restarts"),
    "restarts": ("restarts", "", "random initialisations run; the lowest objective wins"),
    "restarts_diverged": ("restarts diverged", "", "restarts dropped for NaN or inf (with a "
                          "permutation search, in every label order)"),
    "wall_time_s": ("wall time", "s", "of the attack, compilation included"),
    "model": ("model", "", "the attacked network"),
    "threat_model": ("threat model", "", "what the client sent: fedsgd (a gradient) or fedavg (an "
                     "update after local training)"),
    "num_samples": ("examples", "", "behind the update"),
    "device": ("device", "", ""),
}

def privacy_line(privacy: dict) -> str:
  """A client's DP-SGD and its guarantee (:func:`gradjax.run.pipeline.dp_sgd_privacy`), in one line."""
  how = f"clipping bound {privacy['max_norm']:g}, noise multiplier {privacy['noise_multiplier']:g}"
  if privacy.get("noise_multiplier_declared") is False:
    return (f"clipping bound {privacy['max_norm']:g}, no noise multiplier declared: read as clipping "
            "only (noise multiplier 0, ε infinite); a client that added noise declares "
            "dp_sgd_noise_multiplier")
  if privacy["epsilon"] is None:
    return f"{how}: without noise no differential privacy (ε infinite)"
  declared = privacy.get("steps_declared")
  return (f"{how}: ({privacy['epsilon']:.3g}, {privacy['delta']:g})-DP over {privacy['steps']} "
          f"step{'s' if privacy['steps'] != 1 else ''}"
          + ("" if declared is None else f" (the simulated round's own; {declared} declared)")
          + f" at sampling rate {privacy['sampling_rate']:g} "
          f"(Rényi DP of the sampled Gaussian, order {privacy['order']:g})")


VERDICT_COLOURS = {"leak": "#b00020", "no_leak_found": "#1b5e20", "inconclusive": "#8a6d00"}


def summary_rows(results: dict, keys) -> list[tuple[str, str, str]]:
  """(label, value with its unit, meaning) of each key of ``keys`` present in ``results``. A closed
  form's ``iterations`` are what it counts, and it has no restarts (but for a token search that
  took over from the span attack)."""
  rows = []
  attack = results.get("attack")
  closed = isinstance(attack, dict) and "closed_form" in attack and not results.get("take_over")
  for key in keys:
    if closed and key in ("restarts", "restarts_diverged", "evaluations"):
      continue
    value = results.get(key)
    if key == "residual" and isinstance(value, dict):
      value = value.get("relative_error")
    if key == "privacy" and isinstance(value, dict):
      value = "∞" if value["epsilon"] is None else f"{value['epsilon']:.3g} (δ {value['delta']:g})"
    if value is None:
      continue
    label, unit, meaning = QUANTITIES.get(key, (key, "", ""))
    if closed and key == "iterations":
      label, meaning = "steps", ("what the closed form counts (rounds, layers, positions or "
                                 "read-outs): nothing is optimised")
    rows.append((label, _cell(value) + (f" {unit}" if unit else ""), meaning))
  return rows


# Eleven parameters: the page's parts (title, summary, table, figures, configuration, verdict, notes,
# sections, provenance), each optional but the first ones; a record would only rename them.
def html_report(path, title: str, summary, table: Sequence[dict], figures: dict[str, str],
                config: dict, table_title: str = "Per image", *, verdict: dict | None = None,
                notes: Sequence[str] = (), sections: Sequence[tuple[str, Sequence[dict]]] = (),
                provenance: dict | None = None) -> None:
  """One self-contained HTML page (images embedded as data URIs): the ``verdict`` (status and
  reason) and ``notes`` on top, the summary (a dict, or (label, value, meaning) rows), a per-item
  table (strings left-aligned), further ``sections`` (heading, rows), the figures (caption -> PNG
  or SVG file), how the run was made (``provenance``: command, versions, device) and the configuration."""
  import base64
  import html
  parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}"
           "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f3f3f3}"
           "td.m{text-align:left;color:#555;font-size:90%}"
           ".verdict{border:2px solid;padding:.6em 1em;margin:1em 0}.verdict b{font-size:120%}"
           "img{max-width:100%;border:1px solid #ddd}pre{background:#f7f7f7;padding:1em;overflow:auto}"
           "</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
  if verdict:
    colour = VERDICT_COLOURS.get(verdict.get("status"), "#333")
    parts.append(f"<div class='verdict' style='border-color:{colour}'><b style='color:{colour}'>"
                 f"Verdict: {html.escape(str(verdict.get('status')).replace('_', ' '))}</b><br>"
                 f"{html.escape(str(verdict.get('reason', '')))}</div>")
  parts += [f"<p>{html.escape(n)}</p>" for n in notes]
  parts.append("<table>")
  if isinstance(summary, dict):
    parts += [f"<tr><th>{html.escape(k)}</th><td>{_cell(v)}</td></tr>" for k, v in summary.items()]
  else:
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td><td class='m'>"
              f"{html.escape(m)}</td></tr>" for k, v, m in summary]
  parts.append("</table>")

  def rows_table(heading, rows):
    keys = list(rows[0])
    out = [f"<h2>{html.escape(heading)}</h2><table><tr>"
           + "".join(f"<th>{html.escape(k)}</th>" for k in keys) + "</tr>"]
    out += ["<tr>" + "".join(("<td style='text-align:left'>" if isinstance(row.get(k), str) else "<td>")
                             + f"{_cell(row.get(k))}</td>" for k in keys) + "</tr>" for row in rows]
    out.append("</table>")
    return out

  if table:
    parts += rows_table(table_title, table)
  for heading, rows in sections:
    if rows:
      parts += rows_table(heading, rows)
  for caption, file in figures.items():
    with open(file, "rb") as fh:
      data = base64.b64encode(fh.read()).decode("ascii")
    mime = "image/svg+xml" if str(file).endswith(".svg") else "image/png"
    parts.append(f"<h2>{html.escape(caption)}</h2><img alt='{html.escape(caption)}' "
                 f"src='data:{mime};base64,{data}'>")
  if provenance:
    parts.append("<h2>How this run was made</h2><table>")
    parts += [f"<tr><th>{html.escape(k)}</th><td style='text-align:left'><code>{html.escape(str(v))}"
              "</code></td></tr>" for k, v in provenance.items() if v is not None]
    parts.append("</table>")
  parts.append("<h2>Configuration</h2><pre>" + html.escape(json.dumps(_to_python(config, ""), indent=2,
                                                                         sort_keys=True)) + "</pre>")
  parts.append("</body></html>\n")
  atomic_write(path, lambda f: f.write("\n".join(parts)), binary=False)


PROVENANCE_KEYS = ("command", "date", "device", "cores", "gradjax", "jax", "flax",
                   "optax", "python")


def _provenance(results: dict) -> dict:
  return {k: results[k] for k in PROVENANCE_KEYS if results.get(k) is not None}


def check_rows(results: dict) -> list[dict]:
  """The checks of a captured update (:func:`gradjax.fidelity.check_capture`) as table rows."""
  rows = []
  checks = results.get("checks") or {}
  if "kind" in checks:
    a = checks["kind"]
    rows.append({"check": f"the file's kind (declared {a['declared']}) against the weights sent",
                 "result": "passed" if a["ok"] else "failed", "detail": a["explained"] or ""})
  if "count" in checks:
    a = checks["count"]
    rows.append({"check": f"examples (declared {a['declared']}) against the classes the last layer's "
                          "bias gradient names", "result": "passed" if a["ok"] else "failed",
                 "detail": a["explained"] or ""})
  if "labels" in checks:
    a = checks["labels"]
    rows.append({"check": "declared labels against the last layer's bias gradient",
                 "result": "passed" if a["ok"] else "failed", "detail": a["explained"] or ""})
  if "activation" in checks:
    a = checks["activation"]
    declared = f" (declared {a['declared']})" if "declared" in a else ""
    rows.append({"check": f"activation{declared} read off the last layer's gradient",
                 "result": "not run" if a["ok"] is None else "passed" if a["ok"] else "failed",
                 "detail": a["explained"] or ""})
  if "fidelity" in checks:
    f = checks["fidelity"]
    if f.get("ok") is None:
      rows.append({"check": "update recomputed from the ground truth", "result": "not run",
                   "detail": f["explained"]})
    else:
      detail = (f"relative error {f['relative_error']:.3g}, cosine {f['cosine']:.6f} (tolerance "
                f"{f['tolerance'][0]:g} over all layers, {f['tolerance'][1]:g} per layer)")
      if f.get("explained"):
        detail = f["explained"]
      rows.append({"check": "update recomputed from the ground truth",
                   "result": "passed" if f["ok"] else "failed", "detail": detail})
  return rows


def time_rows(results: dict) -> list[dict]:
  """Where a run's time went (:func:`gradjax.run.pipeline.time_spent`) as table rows: each phase's
  seconds and the seconds of making programs in it."""
  phases = (results.get("time") or {}).get("phases") or {}
  return [{"phase": name, "seconds": p["seconds"], "making programs (s)": p["making_programs"],
           "tracing (s)": p["tracing"], "lowering (s)": p["lowering"],
           "compiling or loading (s)": p["compiling"]} for name, p in phases.items()]


def program_rows(results: dict) -> list[dict]:
  """The programs that took longest to make, as table rows."""
  return [{"program": p["name"], "tracing (s)": p["tracing"], "lowering (s)": p["lowering"],
           "compiling or loading (s)": p["compiling"],
           "from the persistent cache": "yes" if p["cached"] else "no"}
          for p in (results.get("time") or {}).get("largest_programs") or []]


def residual_rows(results: dict) -> list[dict]:
  """The relative residual per layer (:func:`gradjax.verdict.residual`) as table rows."""
  residual = results.get("residual") or {}
  return [{"layer": k, "relative residual": v["relative_error"], "cosine": v["cosine"]}
          for k, v in (residual.get("layers") or {}).items()]


def write_run(out: str, results: dict, images: dict, title: str) -> None:
  """A run's files in ``out``: ``metrics.json``; ``reconstruction.npy`` (N, H, W, C) float32 in
  [0, 1] (the ground truth's order when there is one); with ``images["model_input"]``,
  ``model_input.npy``: the attack's data as the model reads them, unclipped, in the order of
  ``labels_by_slot`` (what the residual recomputed the update from); ``reconstruction.png`` (pixel grid, ground
  truth above); ``grid.svg`` (the same, captioned with the per-image metrics); ``curves.svg``
  (objective, and PSNR where there is a ground truth, against iterations; :mod:`gradjax.run.svg`) and ``report.html``, one self-contained
  page of all of it with the verdict on top."""
  rec, truth = images["reconstruction"], images.get("ground_truth")
  save_json(os.path.join(out, "metrics.json"), results)
  atomic_write(os.path.join(out, "reconstruction.npy"),
                      lambda fh: np.save(fh, np.asarray(rec, np.float32), allow_pickle=False), binary=True)
  if images.get("model_input") is not None:
    atomic_write(os.path.join(out, "model_input.npy"), lambda fh: np.save(
        fh, np.asarray(images["model_input"], np.float32), allow_pickle=False), binary=True)
  rows = [rec] if truth is None else [truth, rec]
  save_png(os.path.join(out, "reconstruction.png"), image_grid(rows))
  named = [("reconstruction", rec)] if truth is None else [("ground truth", truth),
                                                           ("reconstruction", rec)]
  pad = max(1, rec.shape[2] // 8)
  write_svg(os.path.join(out, "grid.svg"), svg.reconstruction(
      image_grid([images for _, images in named], pad=pad, scale=1), rec.shape[:3], pad,
      [name for name, _ in named], per_image_captions(results), title))
  figures = {"Reconstruction" + (" (ground truth above)" if truth is not None else
                                 " (no ground truth)"): os.path.join(out, "grid.svg")}
  if results.get("history"):
    write_svg(os.path.join(out, "curves.svg"), svg.curves(results["history"], title))
    with_psnr = any("psnr" in r for r in results["history"])
    figures["Objective and PSNR by iteration" if with_psnr else "Objective by iteration"] = \
        os.path.join(out, "curves.svg")
  summary = summary_rows(results, ("psnr", "psnr_unclamped", "ssim", "lpips", "mse", "label_accuracy",
                                   "loss", "residual", "privacy", "model", "threat_model", "num_samples", "iterations",
                                   "evaluations", "restarts", "restarts_diverged", "wall_time_s"))
  notes = []
  if truth is None:
    notes.append("No ground truth was given (--dataset with the client's images scores the "
                 "reconstruction): the objective and the residual per layer say how closely the "
                 "attack matched the update.")
  elif results.get("lpips") is None and results.get("lpips_absent"):
    notes.append(f"LPIPS is not reported: {results['lpips_absent']}.")
  table = []
  for i in range(rec.shape[0]):
    row = {"image": i}
    for key, label in (("psnr", "PSNR (dB)"), ("ssim", "SSIM"), ("lpips", "LPIPS"), ("mse", "MSE")):
      if results.get(f"{key}_per_image") is not None:
        row[label] = results[f"{key}_per_image"][i]
    if results.get("labels_true") is not None:
      row["label"] = results["labels_true"][i]
      row["recovered label"] = results["labels_reconstructed"][i]
    elif results.get("labels_by_slot") is not None:
      row["recovered label"] = results["labels_by_slot"][i]
    table.append(row)
  html_report(os.path.join(out, "report.html"), title, summary, table, figures,
              {"config": results.get("config"), "attack": results.get("attack")},
              verdict=results.get("verdict"), notes=notes,
              sections=[("Checks of the captured update", check_rows(results)),
                        ("Residual per layer", residual_rows(results)),
                        ("Where the time went", time_rows(results)),
                        ("Programs that took longest to make", program_rows(results))],
              provenance=_provenance(results))


def sentence_table(results: dict) -> str:
  """The recovered sentences beside the true ones, one block per sentence, as plain text."""
  lines = []
  for i, row in enumerate(results["sentences"]):
    lines.append(f"sentence {i}  token accuracy {row['token_accuracy']:.2f}  bag recall "
                 f"{row['bag_recall']:.2f}")
    width = max(len(k) for k in row if k.startswith(("true", "recovered")))
    lines += [f"  {k:<{width}}  {v}" for k, v in row.items() if k.startswith(("true", "recovered"))]
  return "\n".join(lines) + "\n"


def write_text_run(out: str, results: dict, title: str) -> None:
  """A text run's files in ``out``: ``metrics.json``; ``sentences.txt`` (each recovered sentence
  under the true one, :func:`sentence_table`); ``curves.svg`` (the objective against iterations) and
  ``report.html`` with all of it."""
  save_json(os.path.join(out, "metrics.json"), results)
  atomic_write(os.path.join(out, "sentences.txt"), lambda f: f.write(sentence_table(results)),
               binary=False)
  figures = {}
  if results.get("history"):
    write_svg(os.path.join(out, "curves.svg"), svg.curves(results["history"], title))
    figures["Objective by iteration"] = os.path.join(out, "curves.svg")
  summary = summary_rows(results, ("token_accuracy", "rouge1", "rouge2", "rougeL", "bag_recall",
                                   "word_recall", "word_recall_chance", "loss", "residual", "privacy", "model",
                                   "num_samples", "iterations", "evaluations", "restarts",
                                   "restarts_diverged", "wall_time_s"))
  summary += [(k.replace("_", " "), _cell(results[k]), "") for k in
              ("vocabulary_size", "sequence_length", "token_accuracy_nearest", "bag_recall_nearest",
               "exact", "bag_size") if results.get(k) is not None]
  table = [{"sentence": i, **{k: v for k, v in row.items()}} for i, row in enumerate(results["sentences"])]
  html_report(os.path.join(out, "report.html"), title, summary, table, figures,
              {"config": results.get("config"), "attack": results.get("attack")},
              table_title="Sentences", verdict=results.get("verdict"),
              sections=[("Residual per layer", residual_rows(results)),
                        ("Where the time went", time_rows(results)),
                        ("Programs that took longest to make", program_rows(results))],
              provenance=_provenance(results))
