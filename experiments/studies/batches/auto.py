"""The batches study's audit rows: ``--attack=auto`` at a stated CPU budget per batch, as an audit
runs it, on untrained models (a fresh draw per batch; one row on the trained ResNet-20 of
hfginv_batch), CIFAR-10 test images 500.. in [0, 1] (never
used to choose a setting), labels inferred as the audit infers them (iDLG's sign at batch 1, which
iDLG reads itself; for a batch LLG*'s counts from the head's gradient, its impact measured on dummy
images through the server's model; the rows ending in ``_llg``: plain LLG, the audit's rule before;
the rows ending in ``_breaching``: labels known, as breaching's attacker had them).

  python experiments/studies/batches/auto.py            # runs what is missing, writes the table
  python experiments/studies/batches/auto.py --table    # the table from the runs there
  python experiments/studies/batches/auto.py --rows=lenet_b8,convnet64_b8_500   # some rows only

Each row is a ``gradjax sweep`` (its command in the run's results.json) into ``runs/auto/<row>/``;
one process attacks the row's batches in turn, so the first batch's budget pays the compilation.
``--budget`` fits the attack's iterations into the time (``gradjax.run.pipeline.budget_iterations``)
and spends what is left on restarts. ``table.md`` and ``table.json`` give per row the attacks run,
their iterations, mean and median per-image PSNR, SSIM, the images recognisable by the verdict's
rule, the leak verdicts, label accuracy and the seconds per batch.
"""

import os

import numpy as np

import sweeps

RUNS = os.path.join(sweeps.HERE, "runs", "auto")
LENET = ("--model=lenet_zhu",)  # DLG's LeNet: sigmoid, every weight U(-0.5, 0.5)
RESNET20 = os.path.join("experiments", "studies", "hfginv_batch", "runs", "train_resnet20_cifar10", "epoch_5.npz")

# (row, batch size, first image, batches, budget in seconds per batch, label rule, further flags);
# rows ending in _llg ran while the audit inferred a batch's labels by plain LLG, before LLG*.
BATCHES = ((4, 4), (8, 4), (16, 2), (32, 1))  # (batch size, batches): 16-32 images a row
ROWS = [("lenet_b1", 1, 500, 4, 120, None, LENET)] + [
    (f"lenet_b{b}_llg", b, 500, count, 120, "llg", LENET) for b, count in BATCHES[:3]] + [
    (f"lenet_b{b}", b, 500, count, 120, "llg_star", LENET) for b, count in BATCHES] + [
    # Geiping et al.'s ConvNet at the paper's width, batch 8, the issue's 15 minutes on one core; a
    # batch per row so that two run side by side.
    (f"convnet64_b8_{start}{suffix}", 8, start, 1, 900, rule, ("--model=convnet-64",))
    for suffix, rule, starts in (("_llg", "llg", (500, 508)), ("", "llg_star", (500, 508, 516, 524)))
    for start in starts] + [
    # Side by side with breaching 0.1.2's Inverting Gradients attacker (runs/breaching): the same
    # batches, model draws and labels (known, as breaching had them), a budget per batch of
    # breaching's own seconds per batch there (compilation included).
    (f"lenet_b{b}_{start}_breaching", b, start, 5, seconds, "known", LENET)
    for b, start, seconds in ((4, 900, 27), (4, 500, 31), (8, 900, 36), (8, 500, 37))] + [
    # ConvNet-64 at batch 1; the committed trained ResNet-20 (hfginv_batch's, its own 10-class head)
    # at batch 8; a FedAvg client of DLG's LeNet (one local epoch over mini-batches of 4: two steps).
    ("convnet64_b1", 1, 500, 2, 300, "idlg", ("--model=convnet-64",)),
    ("resnet20_trained_b8", 8, 500, 2, 600, "llg_star", ("--model=resnet20", f"--checkpoint={RESNET20}")),
    ("lenet_b8_fedavg", 8, 500, 4, 120, "llg_star",
     LENET + ("--client=fedavg", "--config.client.local_epochs=1", "--config.client.local_batch_size=4"))]


def run(row, batch, start, count, budget, rule, extra, data_dir):
  labels = () if rule is None else (f"--labels={rule}",)
  sweeps.sweep(os.path.join(RUNS, row), ["--attack=auto", "--dataset=cifar10", f"--budget={budget}",
                                         f"--batch_size={batch}", f"--start={start}", f"--count={count}",
                                         *labels, *extra], data_dir, ("reconstructions.png",))


def table() -> tuple[str, dict]:
  """The table (markdown) and its numbers by row."""
  numbers = {}
  lines = ["| model | batch | images | labels | budget per batch (s) | attacks run (iterations; restarts) | "
           "PSNR per image, mean (dB) | median | SSIM, mean | recognisable (verdict's rule) | "
           "leak verdicts | label accuracy | s per batch |", "|---" * 13 + "|"]
  for row, batch, start, count, budget, rule, extra in ROWS:
    rows = sweeps.rows(RUNS, row)
    if rows is None:
      continue
    n = sweeps.summary(rows)
    labels = float(np.mean([r["label_accuracy"] for r in rows]))
    seconds = [r["wall_time_s"] for r in rows]
    runs = [t for r in rows for t in r["auto"]["tried"]]
    ran = []
    for name in dict.fromkeys(t["attack"] for t in runs):  # in the order first tried
      its = sorted({t["iterations"] for t in runs if t["attack"] == name})
      most = max(t["restarts"] for t in runs if t["attack"] == name)
      span = f"{its[0]}" + (f"-{its[-1]}" if len(its) > 1 else "")
      ran.append(f"{name} ({span}; {'1-' if most > 1 else ''}{most})")
    numbers[row] = {**n, "recognisable_share": n["recognisable"] / n["images"], "label_accuracy": labels,
                    "seconds_max": float(np.max(seconds)), "budget_s": budget, "tried": ran}
    model = next(e.split("=", 1)[1] for e in extra if e.startswith("--model="))
    model += " (trained)" * any(e.startswith("--checkpoint=") for e in extra)
    model += ", FedAvg" * ("--client=fedavg" in extra)
    images = f"{rows[0]['index']}..{rows[-1]['index'] + batch - 1}"
    lines.append(f"| {model} | {batch} | {images} | {rule or 'idlg'} | {budget} | {'; '.join(ran)} | "
                 f"{sweeps.cells(n)} | {labels:.3f} | "
                 f"{n['seconds_per_batch']:.0f} (max {np.max(seconds):.0f}) |")
  return "\n".join(lines) + "\n", numbers


if __name__ == "__main__":
  sweeps.main(__doc__, RUNS, ROWS, run, table)
