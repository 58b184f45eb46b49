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
N(0, 1); ``--config.attack.iterations`` sets every row's budget, DLG's and cosine's too.
``--config.attack.box=True`` clamps every attack's dummy image to [0, 1] after each step and
``--config.attack.box=False`` (the ``dlm`` configuration's) clamps none, overriding the
``dlm_plus`` preset's box, so all rows share one protocol. Model, data and client come from
``--config=dlm`` (the default; flags override it). Success is PSNR > 30 dB with the standard
formula and, separately, with the paper's (the error divided by the dataset's per-channel std,
:func:`gradjax.metrics.psnr_std`, about 11.5 dB higher). Each attack is kept in
``items/`` as it ends; ``--resume`` reads those back and continues the interrupted one.

The paper states neither how γ starts nor how it learns; ``--methods='DLM;gamma'`` runs DLM with
each reading of those details (:class:`gradjax.objectives.Gamma`: γ from 1/lr, on an Adam of its own,
held for the first steps; from 200, as the authors' released code starts it) and with γ held at 1/lr
throughout, the bound any γ rule can reach.

Rows (``--methods``): ``DLG``, ``cosine``, ``DLM``, ``DLM (joint labels)``, ``DLM+``, ``DLM+ (iDLG
labels)`` (the default), the γ variants (``gamma`` for all of them), ``DLM+, released code``
(``dlm_plus_released``: the authors' normaliser, true label and 5000 iterations).

  gradjax dlm-table --count=20
  gradjax dlm-table --count=20 --config.attack.box=True
  gradjax dlm-table --count=20 --config.attack.box=True --methods='DLM;gamma' --output_dir=runs/dlm_gamma_box
"""

import os
import time

import numpy as np
from absl import app, flags, logging

from gradjax.cli import common
from gradjax import configs, data, metrics
from gradjax.run import campaign, config, report

METHODS = {
    "DLG": {
        "attack.preset": "dlg", "attack.matched": "replay", "attack.optimizer": "adam",
        "attack.learning_rate": 0.1, "attack.iterations": 4000
    },
    "cosine": {
        "attack.preset": "dlg", "attack.matched": "replay", "attack.distance": "cosine",
        "attack.optimizer": "adam", "attack.learning_rate": 0.1, "attack.iterations": 4000
    },
    "DLM": {"attack.preset": "dlm"},
    "DLM (joint labels)": {"attack.preset": "dlm", "attack.label_source": "joint"},
    "DLM+": {"attack.preset": "dlm_plus"},
    "DLM+ (iDLG labels)": {"attack.preset": "dlm_plus", "attack.label_source": "idlg"},
}
# DLM's unstated details (issue 14): how γ starts and learns; {inv_lr} is 1 / --local_lr.
GAMMA_VARIANTS = {
    "DLM, γ from 1/lr": {"attack.preset": "dlm", "attack.gamma": "init={inv_lr}"},
    "DLM, γ on Adam lr 0.01": {"attack.preset": "dlm", "attack.gamma": "lr=0.01"},
    "DLM, γ on Adam lr 1": {"attack.preset": "dlm", "attack.gamma": "lr=1"},
    "DLM, γ held 500 steps": {"attack.preset": "dlm", "attack.gamma": "frozen=500"},
    "DLM, γ from 1/lr, held 500 steps": {
        "attack.preset": "dlm", "attack.gamma": "init={inv_lr},frozen=500"
    },
    "DLM, γ from 1/lr on Adam lr 0.001": {
        "attack.preset": "dlm", "attack.gamma": "init={inv_lr},lr=0.001"
    },
    "DLM, γ from 1/lr, joint labels": {
        "attack.preset": "dlm", "attack.label_source": "joint", "attack.gamma": "init={inv_lr}"
    },
    # The authors' released DLM.py: γ (their k) starts at 200 whatever the lr and moves on the data's
    # Adam (lr 0.1) as a plain number, 0.1 a step; in log γ that step is 0.0005 at the start.
    "DLM, γ from 200 on Adam lr 0.0005": {"attack.preset": "dlm", "attack.gamma": "init=200,lr=0.0005"},
    # γ never moves from 1/lr: iDLG on the gradient ΔW / lr, the bound any γ rule can reach.
    "DLM, γ = 1/lr throughout": {
        "attack.preset": "dlm", "attack.gamma": "init={inv_lr},frozen=1000000"
    },
}
# DLM+ as the authors' released DLM_plus.py runs it (presets.dlm_plus_released): each tree over the
# mean of its layers' norms, the true label, 5000 iterations (the protocol's clamp, if any, kept).
RELEASED = {"DLM+, released code": {"attack.preset": "dlm_plus_released"}}
ALL_METHODS = {**METHODS, **GAMMA_VARIANTS, **RELEASED}

# The paper's protocol (gradjax/configs/dlm.py); --methods names the attacks (the protocol's preset
# is the rows' base) and --start/--count the images, not --index.
common.define_flags("dlm", omit=("data.index",), batched=True)
common.define_table_flags(methods=True)
common.define_output_flags()
common.define_launch_flags(collectives=False)  # experiments split over processes
flags.adopt_module_key_flags(common)


def experiments(name: str, overrides: dict, indices, base: dict) -> list[tuple[str, config.Config]]:
  """(key, configuration) of ``name``'s experiment on each image of ``indices``."""
  return [(f"{name}_{index}", config.from_options({**base, **overrides, "data.index": index}))
          for index in indices]


def run_method(name: str, overrides: dict, indices, std, threshold: float, base: dict,
               items: campaign.Items) -> dict:
  rows = []
  for (key, cfg), index in zip(experiments(name, overrides, indices, base), indices):
    results, images, _ = items.run(key, cfg)
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


def markdown(table: list[dict], title: str, threshold: float, seconds: float, local_lr: float) -> str:
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
    lines += ["", f"DLM's learned γ, median over the images (1 / lr = {1 / local_lr:g}): "
              + "; ".join(gammas) + "."]
  lines += ["", f"Total {seconds:.0f} s.", ""]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  if f["modality"].present and f.modality != "image":  # before its FedAvg rows are checked for text
    common.fail("gradjax dlm-table tabulates image attacks; for text use gradjax text-table (or "
                "reconstruct --modality=text)")
  names = common.semicolon_list("methods", f.methods or ";".join(METHODS))
  if "gamma" in names:
    names = [m for m in names if m != "gamma"] + list(GAMMA_VARIANTS)
  unknown = [m for m in names if m not in ALL_METHODS]
  if unknown or not names or f.count < 1:
    common.fail(f"need a positive --count and methods from {'; '.join(ALL_METHODS)}; got {f.methods!r}")
  def rows(cfg, files=True):
    """Each method's options over ``cfg``; ValueError where the table or a row cannot run."""
    if cfg.attack.preset != configs.get("dlm").attack.preset:  # each row sets its own
      raise ValueError(f"--attack={cfg.attack.preset}: the table's attacks are its --methods")
    if cfg.client.name != "fedavg" or cfg.attack.box is None:
      raise ValueError("the table attacks one FedAvg step (--client=fedavg), every row with one --config.attack.box=True")
    # DLG's and cosine's 4000 iterations are the protocol's, where the configuration sets none.
    given = {"attack.iterations"} if cfg.attack.iterations is not None else set()
    methods = {m: {k: v.format(inv_lr=1 / cfg.client.local_lr) if k == "attack.gamma" else v
                   for k, v in ALL_METHODS[m].items() if k not in given} for m in names}
    for m in names:
      config.check(config.replace(cfg, methods[m]), files)
    return methods

  cfg = common.config_from_flags(check=rows)
  methods = rows(cfg)
  base = {k: v for k, v in config.options(cfg).items() if k != "data.index"}
  std = data.normalization(cfg.data.dataset).std if cfg.data.dataset in ("cifar10",
                                                                         "cifar100") else (1.0,)
  out = common.output_folder("dlm_table" + ("_box" if cfg.attack.box else ""),
                             own=("results.md", "results.json", "items/*.json", "items/*.npz", "config.py"))
  items = common.items(out)
  start = time.perf_counter()
  indices = range(f.start, f.start + f.count)
  try:
    if not common.plan(items, [e for m in names for e in experiments(m, methods[m], indices, base)]):
      return  # over several processes: this one's experiments are written, process 0 goes on
    table = [run_method(m, methods[m], indices, std, f.psnr_threshold, base, items) for m in names]
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  seconds = items.earlier_s + time.perf_counter() - start  # with the experiments read back
  common.write_config(out, cfg, rows=True)  # each row sets its attack
  report.save_json(
      os.path.join(out, "results.json"), {
          "table": table, "total_time_s": seconds, "box": cfg.attack.box, "model": cfg.model.name,
          "dataset": cfg.data.dataset, "images": [f.start, f.start + f.count - 1],
          "local_lr": cfg.client.local_lr, "std": list(std), **common.provenance()
      })
  title = (
      f"Attacks on one FedAvg step (lr {cfg.client.local_lr:g}), {cfg.model.name}, {cfg.data.dataset} "
      f"{f.start}..{f.start + f.count - 1}{', dummy clamped to [0, 1]' if cfg.attack.box else ''}")
  text = markdown(table, title, f.psnr_threshold, seconds, cfg.client.local_lr)
  with open(os.path.join(out, "results.md"), "w") as fh:
    fh.write(text)
  print(text)
  print(f"wrote {out}: results.json, results.md, items/")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
