"""DLG, cosine, DLM and DLM+ against FedAvg weights: the DLM paper's Table 1 protocol.

Each CIFAR-100 test image is one client: a fresh MLP 3072-32-ReLU-100 (PyTorch's default init),
one local SGD step at lr 0.01, the server sees W_t and W_{t+1}. Four attacks on that update:

* DLG: the Euclidean distance between the dummy update replayed with the known lr and the observed
  one (= lr² ‖∇W' − ΔW / lr‖², DLG on the gradient ΔW / lr), soft labels optimised jointly;
* cosine: the same with 1 − cosine (learning-rate free);
* DLM: ‖∇W' − γ ΔW‖² with γ learned (preset ``dlm``);
* DLM+: ‖∇W'/‖∇W'‖ − ΔW/‖ΔW‖‖² (preset ``dlm_plus``).

DLM runs with its preset's iDLG labels and with DLG's jointly optimised soft labels, DLM+ with its
preset's joint labels and with iDLG labels.

All four use Adam, 4000 iterations (lr 0.1; DLM+ 0.01, the paper's), one restart, dummy data
N(0, 1). ``--box`` clamps every attack's dummy image to [0, 1] after each step and ``--nobox`` (the
default) clamps none, overriding the ``dlm_plus`` preset's box, so all rows share one protocol. Success is PSNR > 30
dB with the standard formula and, separately, with the paper's (the error divided by the dataset's
per-channel std, :func:`gradjax.metrics.psnr_std`, about 11.5 dB higher). Each attack is kept in
``items/`` as it ends; ``--resume`` reads those back and continues the interrupted one.

The paper states neither how γ starts nor how it learns; ``--methods='DLM;gamma'`` runs DLM with
each reading of those details (:class:`gradjax.objectives.Gamma`: γ from 1/lr, on an Adam of its own,
held for the first steps) and with γ held at 1/lr throughout, the bound any γ rule can reach.

  gradjax dlm-table --count=20
  gradjax dlm-table --count=20 --box
  gradjax dlm-table --count=20 --box --methods='DLM;gamma' --output_dir=experiments/results/dlm_gamma_box
"""

import os
import time

import numpy as np
from absl import app, flags, logging

from gradjax.cli import common
from gradjax import config, data, metrics, report

METHODS = {
    "DLG": dict(attack="dlg", objective="replay", optimizer="adam", learning_rate=0.1,
                iterations=4000),
    "cosine": dict(attack="dlg", objective="replay", distance="cosine", optimizer="adam",
                   learning_rate=0.1, iterations=4000),
    "DLM": dict(attack="dlm"),
    "DLM (joint labels)": dict(attack="dlm", labels="joint"),
    "DLM+": dict(attack="dlm_plus"),
    "DLM+ (iDLG labels)": dict(attack="dlm_plus", labels="idlg"),
}
# DLM's unstated details (issue 14): how γ starts and learns; {inv_lr} is 1 / --local_lr.
GAMMA_VARIANTS = {
    "DLM, γ from 1/lr": dict(attack="dlm", gamma="init={inv_lr}"),
    "DLM, γ on Adam lr 0.01": dict(attack="dlm", gamma="lr=0.01"),
    "DLM, γ on Adam lr 1": dict(attack="dlm", gamma="lr=1"),
    "DLM, γ held 500 steps": dict(attack="dlm", gamma="frozen=500"),
    "DLM, γ from 1/lr, held 500 steps": dict(attack="dlm", gamma="init={inv_lr},frozen=500"),
    "DLM, γ from 1/lr on Adam lr 0.001": dict(attack="dlm", gamma="init={inv_lr},lr=0.001"),
    "DLM, γ from 1/lr, joint labels": dict(attack="dlm", labels="joint", gamma="init={inv_lr}"),
    # γ never moves from 1/lr: iDLG on the gradient ΔW / lr, the bound any γ rule can reach.
    "DLM, γ = 1/lr throughout": dict(attack="dlm", gamma="init={inv_lr},frozen=1000000"),
}
ALL_METHODS = {**METHODS, **GAMMA_VARIANTS}

flags.DEFINE_string("methods", ";".join(METHODS),
                    f"Semicolon-separated subset of {'; '.join(METHODS)}; or of DLM's γ variants: "
                    f"{'; '.join(GAMMA_VARIANTS)}; 'gamma' for all of those.")
flags.DEFINE_string("dataset", "cifar100", "Data source (the paper: CIFAR-100).")
flags.DEFINE_string("data_dir", None, "Data folder (default ../shared/data).")
flags.DEFINE_string("model", "mlp", "Model (the paper: mlp = 3072-32-ReLU-100).")
flags.DEFINE_integer("start", 0, "First image index.")
flags.DEFINE_integer("count", 20, "Images (one client each).")
flags.DEFINE_float("local_lr", 0.01, "The client's local learning rate (one SGD step).")
flags.DEFINE_bool("box", False, "Clamp every attack's dummy image to [0, 1].")
flags.DEFINE_float("psnr_threshold", 30.0, "Success: PSNR above this (dB).")
flags.DEFINE_integer("seed", 0, "PRNG seed.")
common.define_output_flags("dlm_table[_box]")
flags.adopt_module_key_flags(common)


def run_method(name: str, overrides: dict, indices, std, threshold: float, base: dict,
               items: common.Items) -> dict:
  rows = []
  for index in indices:
    cfg = config.Config(index=index, **base, **overrides)
    results, images, _ = items.run(f"{name}_{index}", cfg)
    paper = float(metrics.psnr_std(images["reconstruction"], images["ground_truth"], std)[0])
    rows.append({"index": index, "psnr": results["psnr"], "psnr_paper": paper,
                 "ssim": results["ssim"], "lpips": results.get("lpips"),
                 "label_accuracy": results["label_accuracy"],
                 "loss": results["loss"], "gamma": results["gamma"],
                 "wall_time_s": results["wall_time_s"]})
    logging.info("%s image %d: PSNR %.2f dB (paper formula %.2f)%s", name, index, results["psnr"],
                 paper, "" if results["gamma"] is None else f", gamma {results['gamma']:.3g}")
  psnr = np.array([r["psnr"] for r in rows])
  paper = np.array([r["psnr_paper"] for r in rows])
  lpips = [r["lpips"] for r in rows]
  gammas = [r["gamma"] for r in rows if r["gamma"] is not None]
  return {"method": name, "config": overrides, "rows": rows,
          "gamma_median": float(np.median(gammas)) if gammas else None,
          "lpips_mean": float(np.mean(lpips)) if None not in lpips else None,
          "success": float(np.mean(psnr > threshold)),
          "success_paper": float(np.mean(paper > threshold)),
          "psnr_mean": float(psnr.mean()), "psnr_median": float(np.median(psnr)),
          "ssim_mean": float(np.mean([r["ssim"] for r in rows])),
          "label_accuracy": float(np.mean([r["label_accuracy"] for r in rows]))}


def markdown(table: list[dict], title: str, threshold: float, seconds: float) -> str:
  """The table in Markdown; an LPIPS column when every method has LPIPS (the lpips extra)."""
  with_lpips = all(t.get("lpips_mean") is not None for t in table)
  lines = [f"# {title}", "", f"| method | success (PSNR > {threshold:g}) | success, paper's PSNR | "
           "PSNR mean (median) | SSIM | " + ("LPIPS | " if with_lpips else "") + "label acc. |",
           "|---|---|---|---|---|---|" + ("---|" if with_lpips else "")]
  for t in table:
    lines.append(f"| {t['method']} | {100 * t['success']:.0f} % | {100 * t['success_paper']:.0f} % | "
                 f"{t['psnr_mean']:.2f} ({t['psnr_median']:.2f}) | {t['ssim_mean']:.3f} | "
                 + (f"{t['lpips_mean']:.3f} | " if with_lpips else "") + f"{t['label_accuracy']:.2f} |")
  gammas = [f"{t['method']} {t['gamma_median']:.3g}" for t in table if t.get("gamma_median") is not None]
  if gammas:
    lines += ["", f"DLM's learned γ, median over the images (1 / lr = {1 / flags.FLAGS.local_lr:g}): "
              + "; ".join(gammas) + "."]
  lines += ["", f"Total {seconds:.0f} s.", ""]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  names = [m.strip() for m in f.methods.split(";") if m.strip()]
  if "gamma" in names:
    names = [m for m in names if m != "gamma"] + list(GAMMA_VARIANTS)
  unknown = [m for m in names if m not in ALL_METHODS]
  if unknown or not names or f.count < 1:
    common.fail(f"need a positive --count and methods from {'; '.join(ALL_METHODS)}; got {f.methods!r}")
  methods = {m: {k: v.format(inv_lr=1 / f.local_lr) if k == "gamma" else v
                 for k, v in ALL_METHODS[m].items()} for m in names}
  base = dict(model=f.model, dataset=f.dataset, data_dir=f.data_dir, client="fedavg",
              local_lr=f.local_lr, box=f.box, seed=f.seed, chunk=1000)
  std = data.normalization(f.dataset).std if f.dataset in ("cifar10", "cifar100") else (1.0,)
  out = common.output_folder("dlm_table" + ("_box" if f.box else ""),
                             own=("results.*", "items/*.json", "items/*.npz"))
  items = common.Items(out)
  start = time.perf_counter()
  try:
    table = [run_method(m, methods[m], range(f.start, f.start + f.count), std, f.psnr_threshold,
                        base, items) for m in names]
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  seconds = items.earlier_s + time.perf_counter() - start  # with the experiments read back
  report.save_json(os.path.join(out, "results.json"),
                   {"table": table, "total_time_s": seconds, "box": f.box, "model": f.model,
                    "dataset": f.dataset, "images": [f.start, f.start + f.count - 1],
                    "local_lr": f.local_lr, "std": list(std), **common.provenance()})
  title = (f"Attacks on one FedAvg step (lr {f.local_lr:g}), {f.model}, {f.dataset} "
           f"{f.start}..{f.start + f.count - 1}{', dummy clamped to [0, 1]' if f.box else ''}")
  text = markdown(table, title, f.psnr_threshold, seconds)
  with open(os.path.join(out, "results.md"), "w") as fh:
    fh.write(text)
  print(text)
  print(f"wrote {out}: results.json, results.md, items/")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
