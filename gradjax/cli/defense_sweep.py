"""Run one attack against a grid of defenses and tabulate how much each one leaks.

For every defense spec (see gradjax.defenses.parse) and every image, the client's update is defended
and then attacked, exactly as ``gradjax reconstruct --defense=SPEC`` would. Writes ``results.json`` and
``results.md`` to ``--output_dir``: per defense, PSNR and SSIM (mean ± population std), label accuracy
and the images recognisable by the verdict's rule (:mod:`gradjax.verdict`: PSNR ≥ 20 dB, SSIM ≥ 0.5 or
LPIPS ≤ 0.2, above the image's own mean colour), the verdicts that were leaks. Each attack is kept in ``items/`` as it ends;
``--resume`` reads those back and continues the interrupted one (the utility models are retrained).

  gradjax defense-sweep --dataset=cifar10 --count=5
  gradjax defense-sweep --defenses="none;gaussian:1e-2;prune:0.3" --count=10
  gradjax defense-sweep --defenses="none;prune:0.2;prune:0.5" --count=3 --config.attack.adaptive=True

With ``--config.attack.adaptive=True`` every defense is attacked twice on the same images: by the plain attack, and by
the attack adapted to that defense (:mod:`gradjax.adaptive`: its objective models what the defense
did); the table has both, with the images each gave a leak verdict, and the plot each defense's
stronger attack. A defense is only as safe as the stronger of the two says.

The default grid is the DLG paper's defense table (Zhu et al. 2019, §5): Gaussian and Laplacian
noise, fp16, int8, and magnitude pruning of 1 % .. 70 %. The paper calls its noise levels 1e-4 ..
1e-1 variances; the grid also holds variances 1e-8 and 1e-6 (standard deviations 1e-4 and 1e-3),
because the paper's pattern (1e-4 leaks, 1e-2 defends) is the one these give when its levels are
read as standard deviations (``experiments/studies/dlg_defenses``). Laplacian noise, which behaves like Gaussian noise
of the same variance, is sampled at every second level (1e-8, 1e-6, 1e-4, 1e-2).

Utility (``--utility``): for every defense, a small model (the configuration's ``utility`` section:
``--config.utility.model``, mlp by default) is trained with that defense on every FedSGD step
(gradjax.training.train_fedsgd: ``utility.epochs`` epochs of mini-batch SGD with momentum on the first
``utility.train_count`` images of ``utility.dataset``, MNIST's test split by default) and tested on the
following ``utility.test_count`` images; the test accuracy is the "utility acc." column. Every defense starts
from the same initial model and the same batch order (``--seed``). ``privacy_utility.svg`` shows the
mean attack PSNR per defense and, with ``--utility``, beside it each defense's utility accuracy
against that PSNR.

  gradjax defense-sweep --defenses="none;gaussian:1e-3;gaussian:1e-2;prune:0.5" --utility
"""

import dataclasses
import os
import time

import jax
from absl import app, flags, logging

from gradjax.cli import common
from gradjax import defenses, models, training, verdict
from gradjax.run import config, report, svg

DLG_TABLE = ("none;gaussian:1e-8;gaussian:1e-6;gaussian:1e-4;gaussian:1e-3;gaussian:1e-2;gaussian:1e-1;"
             "laplacian:1e-8;laplacian:1e-6;laplacian:1e-4;laplacian:1e-2;fp16;int8;prune:0.01;"
             "prune:0.1;prune:0.2;prune:0.3;prune:0.5;prune:0.7")

# --defenses names the defenses and --start/--count the images: not --defense or --index.
common.define_flags(sections=(*config.ATTACK_SECTIONS, "utility"), omit=("defense.spec", "data.index"),
                    batched=True)
common.define_table_flags(psnr=False)  # success is the verdict's rule
flags.DEFINE_string("defenses", DLG_TABLE, "Semicolon-separated defense specs ('none' = undefended).")
common.define_output_flags()
common.define_launch_flags(collectives=False)  # experiments split over processes
flags.adopt_module_key_flags(common)
flags.DEFINE_bool("utility", False, "Also train a model under every defense and report its test accuracy.")


def utility(spec: str, parts: training.Split, cfg: config.UtilityConfig, seed: int = 0) -> dict:
  """Test accuracy of ``cfg.model`` trained with defense ``spec`` on ``parts.train``.

  The model is created from ``jax.random.key(seed)`` and trained by
  :func:`gradjax.training.train_fedsgd` with key ``fold_in(key(seed), 1)``, so every defense starts
  from the same model and sees the same batches.

  Returns:
    ``{"accuracy": test accuracy or None when training diverged, "diverged": bool, "train_loss":
    [per-epoch mean loss], "time_s": float}``.
  """
  start = time.perf_counter()
  defense = defenses.parse(spec)
  defense = None if defense.name == "none" else defense
  key = jax.random.key(seed)
  model = models.create(cfg.model, key, input_shape=parts.train.x.shape[1:],
                        num_classes=parts.train.num_classes)
  try:
    variables, history = training.train_fedsgd(
        model.apply_fn, model.variables, parts.train.x, parts.train.y, key=jax.random.fold_in(key, 1),
        epochs=cfg.epochs, batch_size=cfg.batch_size, learning_rate=cfg.lr,
        momentum=cfg.momentum, defense=defense)
  except FloatingPointError:
    return {"accuracy": None, "diverged": True, "train_loss": [], "time_s": time.perf_counter() - start}
  accuracy = training.evaluate(model.apply_fn, variables, parts.test.x, parts.test.y)
  return {"accuracy": accuracy, "diverged": False, "train_loss": [r["train_loss"] for r in history],
          "time_s": time.perf_counter() - start}


def check_utility(parts: training.Split, cfg: config.UtilityConfig) -> None:
  """Raises a one-line ValueError for utility settings that training would reject (before any attack)."""
  if models.is_text(cfg.model):
    raise ValueError(f"--config.utility.model={cfg.model}: the utility model trains on the table's "
                     f"images; choose one of {', '.join(models.MODELS)}")
  models.create(cfg.model, jax.random.key(0), input_shape=parts.train.x.shape[1:],
                num_classes=parts.train.num_classes)
  try:
    training.check_sgd(len(parts.train.x), cfg.epochs, cfg.batch_size, cfg.lr, cfg.momentum)
  except ValueError as e:
    raise ValueError(f"utility training: {e}") from None
  if len(parts.test.x) < 1:
    raise ValueError("utility needs at least one test image")


def stronger(row: dict) -> str:
  """Which attack of a table row recovers more, by mean PSNR: ``"plain"``, or ``"adaptive"`` when
  the row has the adapted attack's results and they are higher."""
  if "adaptive" in row and row["adaptive"]["summary"]["psnr"]["mean"] > row["summary"]["psnr"]["mean"]:
    return "adaptive"
  return "plain"


def strongest_summary(row: dict) -> dict:
  """The summary of a row's stronger attack (:func:`stronger`)."""
  return row["adaptive"]["summary"] if stronger(row) == "adaptive" else row["summary"]


def verdicts(summary: dict) -> str:
  """"leak / no leak found / inconclusive" counts of a row's experiments, of how many."""
  return (f"{summary['leaks']} / {summary['no_leak_found']} / {summary['inconclusive']} of "
          f"{summary['experiments']}")


def privacy_utility_plot(table: list[dict], psnr_threshold: float, attack: str = "attack") -> str:
  """An SVG figure (:mod:`gradjax.run.svg`): mean PSNR per defense as bars (dashed line at the
  threshold) and, when the rows have a ``"utility"`` entry, utility (test accuracy) against PSNR,
  one labelled point per defense: the privacy/utility trade-off (lower PSNR and higher accuracy is
  better). A defense's PSNR is its stronger attack's (plain or adapted to it, :func:`stronger`); a
  hatched bar is the adapted one's."""
  names = [row["defense"] for row in table]
  psnr = [strongest_summary(row)["psnr"]["mean"] for row in table]
  panels = [svg.bars(names, psnr, psnr_threshold, ylabel=f"{attack} PSNR (dB), mean",
                     xlabel="defense", hatched=[stronger(row) == "adaptive" for row in table],
                     threshold_label=f"recognisable from {psnr_threshold:g} dB (the verdict's PSNR rule)")]
  if all("utility" in row for row in table):
    points = [(p, row["utility"]["accuracy"], n) for p, row, n in zip(psnr, table, names)
              if row["utility"]["accuracy"] is not None]
    panels.append(svg.scatter(points, f"{attack} PSNR (dB): leak", "utility: test accuracy",
                              vline=psnr_threshold))
  return svg.side_by_side(panels)


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  specs = common.semicolon_list("defenses", f.defenses)
  try:  # one defense under two spellings (gaussian:0.01, gaussian:1e-2) is one row twice
    names = [defenses.parse(s).name for s in specs]
  except ValueError as e:
    common.fail(f"--defenses: {e}")
  twice = next((s for k, (s, n) in enumerate(zip(specs, names)) if n in names[:k]), None)
  if twice is not None:
    common.fail(f"--defenses repeats {defenses.parse(twice).name!r} (as {twice!r})")
  if f.count < 1:
    common.fail("need at least one defense and a positive --count")
  table = []
  start = time.perf_counter()
  try:
    base = common.config_from_flags(
        check=lambda c, files: common.images_only(config.check)(
            config.replace(c, {"attack.adaptive": False}), files))
    unused = sorted(p for p in common.command_line_options() if p.startswith("utility.")) if not f.utility else []
    if unused:
      common.fail(f"--config.{unused[0]} sets the utility model, which only --utility trains; add "
                  "--utility or drop it")
    if base.defense.dp_sgd() is not None:
      common.fail("--config.defense.dp_sgd_max_norm would put DP-SGD under every row of the table, "
                  "whose rows are --defenses specs: compare DP-SGD settings with gradjax sweep runs")
    adaptive = base.attack.adaptive  # every defense's row also with the attack adapted to it
    base = config.replace(base, {"attack.adaptive": False})
    for spec in specs:
      if spec != "none":
        defenses.parse(spec)
    ucfg = base.utility
    if f.utility:  # checked before a folder is made
      seed = common.permutation_seed(ucfg.data_seed, "config.utility.data_seed")
      parts = training.load_split(ucfg.dataset, ucfg.train_count, ucfg.test_count, seed,
                                  data_dir=base.data.data_dir)
      check_utility(parts, ucfg)
    out = common.output_folder(
        f"defenses_{base.attack.preset}_{base.model.name}_{base.data.dataset.replace(':', '-')}",
        own=("results.md", "results.json", "privacy_utility.svg", "items/*.json", "items/*.npz",
             "config.py"))
    items = common.items(out)
    def experiments(spec, adapted=False):
      for k in range(f.count):
        cfg = config.replace(base, {"defense.spec": None if spec == "none" else spec,
                                    "attack.adaptive": adapted,
                                    "data.index": f.start + k * base.data.batch_size})
        yield f"{spec}{'_adaptive' if adapted else ''}_{cfg.data.index}", cfg

    attacked = [(spec, False) for spec in specs] + [(spec, True) for spec in specs
                                                    if adaptive and spec != "none"]
    if not common.plan(items, [e for spec, adapted in attacked for e in experiments(spec, adapted)]):
      return  # over several processes: this one's experiments are written, process 0 goes on

    def attack_row(spec, adapted):
      rows = [items.run(key, cfg)[0] for key, cfg in experiments(spec, adapted)]
      summary = report.summarize(rows, verdict.THRESHOLDS.psnr)
      logging.info("%s%s: PSNR %.2f dB, %s/%s images recognisable", spec,
                   " (adaptive)" if adapted else "", summary["psnr"]["mean"],
                   summary.get("recognisable", "–"), summary.get("images", "–"))
      row = {"summary": summary, "psnr_per_image": [r["psnr"] for r in rows]}
      if "lpips" in summary:
        row["lpips_per_image"] = [r["lpips"] for r in rows]
      return row

    for spec in specs:
      table.append({"defense": spec, **attack_row(spec, False)})
      if adaptive and spec != "none":
        table[-1]["adaptive"] = attack_row(spec, True)
      table[-1]["stronger"] = stronger(table[-1])
      if f.utility:
        table[-1]["utility"] = utility(spec, parts, ucfg, base.seed)
        logging.info("%s: utility accuracy %s", spec, table[-1]["utility"]["accuracy"])
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  utility_setup = None
  if f.utility:
    utility_setup = {**dataclasses.asdict(ucfg), "seed": base.seed}
  # Without the defense (each row sets its own), with --config.attack.adaptive as given: the
  # configuration runs the table again, its adapted rows too.
  given = config.replace(base, {"attack.adaptive": adaptive})
  common.write_config(out, given, rows=True)
  report.save_json(os.path.join(out, "results.json"),
                   {"table": table, "config": config.record(given), "utility_config": utility_setup,
                    "total_time_s": items.earlier_s + time.perf_counter() - start,
                    **common.provenance()})
  report.write_svg(os.path.join(out, "privacy_utility.svg"),
                   privacy_utility_plot(table, verdict.THRESHOLDS.psnr, base.attack.preset))
  extra = " utility acc. |" if f.utility else ""
  with_lpips = all("lpips" in row["summary"] for row in table)
  iterations = getattr(config.get_attack(base), "iterations", None)
  lines = [
      f"# {base.attack.preset}" + (f" ({iterations} iterations, {base.attack.restarts} restart"
                                   f"{'s' if base.attack.restarts != 1 else ''})" if iterations else "")
      + f" on {base.model.name} against defenses, {base.data.dataset} {f.start}.."
      f"{f.start + f.count * base.data.batch_size - 1}, batch {base.data.batch_size}", "",
      "| defense | PSNR (dB) | SSIM | " + ("LPIPS | " if with_lpips else "") +
      "label acc. | images recognisable | "
      "verdicts: leak / no leak found / inconclusive |" +
      (" adaptive PSNR (dB) | adaptive SSIM | adaptive recognisable | adaptive verdicts |"
       if adaptive else "") + extra, "|---|---|---|---|---|---|" + ("---|" if with_lpips else "") +
      ("---|" * 4 if adaptive else "") + ("---|" if f.utility else "")
  ]
  for row in table:
    s = row["summary"]
    cell = ""
    if adaptive:
      a = row.get("adaptive", {}).get("summary")
      cell += (" – | – | – | – |" if a is None else
               f" {a['psnr']['mean']:.2f} ± {a['psnr']['std']:.2f} | {a['ssim']['mean']:.3f} | "
               f"{a.get('recognisable', '–')}/{a.get('images', '–')} | {verdicts(a)} |")
    if f.utility:
      acc = row["utility"]["accuracy"]
      cell += " diverged |" if acc is None else f" {acc:.3f} |"
    lines.append(f"| {row['defense']} | {s['psnr']['mean']:.2f} ± {s['psnr']['std']:.2f} | "
                 f"{s['ssim']['mean']:.3f} | "
                 + (f"{s['lpips']['mean']:.3f} | " if with_lpips else "")
                 + (f"{s['label_accuracy']['mean']:.2f} | " if "label_accuracy" in s else "– | ")
                 + f"{s.get('recognisable', '–')}/{s.get('images', '–')} | {verdicts(s)} |{cell}")
  if adaptive:
    lines += ["", "Adaptive: the attack's objective models the row's defense (gradjax.adaptive); "
              "the plot shows each defense's stronger attack (hatched: the adaptive one)."]
  if f.utility:
    u = base.utility
    lines += ["", f"Utility: {u.model} trained {u.epochs} epochs (batch {u.batch_size}, lr {u.lr:g}, "
              f"momentum {u.momentum:g}) on {u.train_count} {u.dataset} images with the defense on "
              f"every step, tested on the next {u.test_count}."]
  lines += ["", f"Total {time.perf_counter() - start:.0f} s.", ""]
  text = "\n".join(lines)
  with open(os.path.join(out, "results.md"), "w") as fh:
    fh.write(text)
  print(text)
  print(f"wrote {out}: results.json, results.md, privacy_utility.svg, items/")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
