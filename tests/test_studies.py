"""RESULTS.md is what experiments/studies.py makes of the studies, and its numbers are the runs'
(recomputed here with NumPy from hand-written run files); every study has its analysis and data."""

import collections
import glob
import importlib.util
import json
import os
import re
import runpy
import shlex

import numpy as np
import pytest
import skimage.metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def studies():
  spec = importlib.util.spec_from_file_location("studies", os.path.join(ROOT, "experiments", "studies.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _write(path, payload):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as fh:
    json.dump(payload, fh)


def test_committed_results_md_is_generated_from_the_studies(studies):
  with open(os.path.join(ROOT, "RESULTS.md")) as fh:
    assert fh.read() == studies.render(), "RESULTS.md is stale: run python experiments/studies.py"


def test_every_study_has_its_analysis_data_and_runs(studies):
  found = studies.studies()
  assert found
  for folder, study in found:
    assert os.path.exists(os.path.join(ROOT, folder, "analysis.md")), folder
    assert study["title"] and study["source"] and study["rows"], folder
    for row in study["rows"]:
      spec = row["ours"]
      paths = [spec["file"]] if "file" in spec else spec["runs"]
      assert all(os.path.exists(os.path.join(ROOT, folder, p)) for p in paths), (folder, paths)


def test_headline_numbers_from_hand_written_runs(studies, tmp_path):
  """Pooled rows of two sweeps and a single run, one number read by path; the table's cells."""
  study = tmp_path / studies.STUDIES / "toy"
  psnr_a, psnr_b, single = [31.0, 12.5, 40.25], [29.5, 35.0], 18.0
  _write(study / "runs" / "a" / "results.json", {"rows": [{"psnr": p} for p in psnr_a]})
  _write(study / "runs" / "b" / "results.json", {"rows": [{"psnr": p} for p in psnr_b]})
  _write(study / "runs" / "c" / "metrics.json", {"psnr": single})
  _write(study / "runs" / "d" / "results.json", {"table": [{"x": 1}, {"acc": 0.875}]})
  _write(study / "study.json", {"title": "Toy", "source": "Someone 2020", "rows": [
      {"quantity": "PSNR mean", "setting": "s", "published": 30.0, "where": "Table 1", "images": "unseen",
       "ours": {"runs": ["runs/a", "runs/b", "runs/c"], "field": "psnr", "statistic": "mean"}},
      {"quantity": "PSNR std", "published": None, "digits": 3,
       "ours": {"runs": ["runs/a", "runs/b"], "field": "psnr", "statistic": "std"}},
      {"quantity": "success", "published": 0.5,
       "ours": {"runs": ["runs/a", "runs/b"], "field": "psnr", "statistic": "fraction_at_least",
                "threshold": 30.0}},
      {"quantity": "accuracy", "published": 0.9, "ours": {"file": "runs/d/results.json",
                                                          "path": "table.1.acc"}}]})
  rows = studies.headline_rows(str(tmp_path))
  pooled = np.array(psnr_a + psnr_b + [single])
  assert rows[0]["ours"] == pytest.approx(pooled.mean()) and rows[0]["gap"] == pytest.approx(pooled.mean() - 30)
  assert rows[1]["ours"] == pytest.approx(np.array(psnr_a + psnr_b).std()) and rows[1]["gap"] is None
  assert rows[2]["ours"] == pytest.approx(3 / 5)
  assert rows[3]["ours"] == 0.875
  table = studies.render(str(tmp_path)).splitlines()
  first = next(line for line in table if "PSNR mean" in line)
  assert first.split(" | ")[3:] == ["unseen", "30.00 (Table 1)", f"{pooled.mean():.2f}",
                                    f"{np.median(pooled):.2f}, {pooled.std():.2f} (6)",
                                    f"{pooled.mean() - 30:+.2f} |"]
  second = next(line for line in table if "PSNR std" in line)  # not a mean: no spread, no range
  assert second.split(" | ")[3:] == ["–", "–", f"{np.array(psnr_a + psnr_b).std():.3f}", "–", "– |"]


def test_config_of_a_recorded_sweep_runs_it_again(studies, tmp_path):
  """The written file sets the rows' recorded options (options recorded before they existed take
  their defaults) and declares the sweep over their images; rows that differ otherwise: an error."""
  import types
  from gradjax.run import config
  rows = [{"config": {"attack": "idlg", "dataset": "cifar10", "index": i, "restarts": 3}} for i in (4, 6)]
  _write(tmp_path / "run" / "results.json", {"rows": rows, "command": "gradjax sweep ..."})
  module = types.ModuleType("written")
  exec(studies.config_of(str(tmp_path / "run")), module.__dict__)
  cfg = config.from_dict(module.get_config())
  assert (cfg.attack.preset, cfg.data.dataset, cfg.attack.restarts,
          cfg.attack.iterations) == ("idlg", "cifar10", 3, None)
  assert module.get_sweep() == [{"data.index": 4}, {"data.index": 6}]
  rows[1]["config"]["restarts"] = 1
  _write(tmp_path / "run" / "results.json", {"rows": rows})
  with pytest.raises(ValueError, match=r"differ in attack\.restarts"):
    studies.config_of(str(tmp_path / "run"))


RUN_CONFIGS = sorted(glob.glob(os.path.join(ROOT, "experiments", "studies", "*", "runs", "**",
                                            "config.py"), recursive=True))


def test_every_committed_runs_configuration_reads_back():
  """Each run folder's config.py (``--config=`` of the run, whichever schema wrote it, options
  renamed since read under their new names) gives a configuration of today's schema."""
  from gradjax.run import config
  assert len(RUN_CONFIGS) > 50
  for path in RUN_CONFIGS:
    spec = importlib.util.spec_from_file_location("run_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
      config.from_options(config.given(module.get_config()))
    except ValueError as e:
      raise AssertionError(f"{os.path.relpath(path, ROOT)}: {e}") from None


RECIPES = sorted(glob.glob(os.path.join(ROOT, "experiments", "studies", "*", "config.py")))


def _study(path):
  return os.path.basename(os.path.dirname(path))


@pytest.mark.parametrize("path", RECIPES, ids=_study)
def test_a_study_recipe_names_every_run_and_the_schema_takes_it(path):
  """Each variant of a study's config.py names a gradjax command, its options are the schema's and
  its sweep is over images and a training recipe sets only options its client reads (``gradjax
  train`` refuses the others); every run in runs/ is a variant's (or a study program's) output."""
  from gradjax import cli
  from gradjax.run import config
  module = runpy.run_path(path)
  variants, programs = module["VARIANTS"], module.get("PROGRAMS", {})
  for name, (command, images, options) in variants.items():
    assert command.split()[0] in cli.COMMANDS, (name, command)
    cfg = config.from_dict(module["get_config"](name))  # raises for an option the schema lacks
    if command.split()[0] == "train":
      given = set(module["BASE"]) | set(options)
      assert not config.unread_by_client(cfg.client.name, given), (name, cfg.client.name)
    sweep = module["get_sweep"](name)
    assert sweep is None or (command.split()[0] == "sweep" and sweep == config.sweep("data.index", images))
  folder = os.path.dirname(path)
  scripts = [f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f != "config.py"]
  for run in os.listdir(os.path.join(folder, "runs")):
    stem = run.split(".")[0]
    assert (any(stem == v or stem.startswith(v + "_") for v in variants) or stem in programs
            or any(s.startswith(stem) for s in scripts)), f"{_study(path)}: runs/{run} is no variant's"


# A small run of each program (its recorded arguments come first; these override them).
SMALL = {
    "sweep": ["--count=1", "--config.attack.iterations=2", "--config.attack.restarts=1",
              "--lpips=none"],
    "reconstruct": ["--config.attack.iterations=2", "--lpips=none"],
    "dlm-table": ["--count=2", "--config.attack.iterations=2", "--methods=DLG;DLM"],
    "label-accuracy": ["--count=2"],
    "label-recovery": ["--count=1", "--aux_size=2"],
    "defense-sweep": ["--count=1", "--config.attack.iterations=2", "--defenses=none", "--noutility"],
    "batch-table": ["--count=1", "--config.attack.iterations=2", "--config.data.batch_size=2",
                    "--config.sampling.classes_per_batch=1", "--config.sampling.pool=40", "--config.attack.aux=4"],
    "text-table": ["--count=2", "--config.attack.iterations=2", "--methods=SAPAG",
                   "--searches=tokens"],
}


def _small_variant(module):
  """The study's first variant whose program has a small run and whose checkpoint is kept."""
  for name, (command, _, options) in module["VARIANTS"].items():
    kept = options.get("model.checkpoint") is None or os.path.exists(
        os.path.join(ROOT, options["model.checkpoint"]))
    if command.split()[0] in SMALL and kept:
      return name, shlex.split(command)
  return None, None


@pytest.mark.slow
def test_every_study_variant_runs_again_from_its_recipe(tmp_path):
  """One variant per study, its command as the recipe names it at a tiny budget, from the clone's
  root: the recipes still drive today's command line to results. The variants of one command run
  one after the other in one process (test_cli.run_in_one_process; a process defines one command's
  flags): the imports paid once, the programs that studies share compiled once. The numbers
  dlm-table and text-table print are recomputed from what they keep (:data:`TABLE_CHECKS`)."""
  from test_cli import run_in_one_process
  by_program, without = collections.defaultdict(list), []
  for path in RECIPES:
    name, command = _small_variant(runpy.run_path(path))
    if name is None:
      without.append(_study(path))
      continue
    program, args = command[0], command[1:]
    out = tmp_path / _study(path)
    if program.startswith("label-"):
      out.mkdir()
      written = "--output=" + str(out / "out.json")
    else:
      written = "--output_dir=" + str(out)
    by_program[program].append((_study(path), ["gradjax", program, *args,
                                               f"--config={os.path.relpath(path, ROOT)}:{name}",
                                               *SMALL[program], written]))
  assert not without, f"no variant with a small run (SMALL above): {without}"
  for runs in by_program.values():
    for (study, argv), proc in zip(runs, run_in_one_process([(argv, ROOT) for _, argv in runs]),
                                   strict=True):
      assert proc.returncode == 0, (study, argv, proc.stderr[-2000:])
      written = os.listdir(tmp_path / study)
      assert any(f.startswith("results") or f.endswith(".json") for f in written), (study, written)
      TABLE_CHECKS.get(argv[1], lambda out: None)(tmp_path / study)


def _check_dlm_table(out):
  """dlm-table's numbers from the images and labels it kept: PSNR and SSIM by scikit-image, the
  DLM paper's PSNR (the error scaled by the dataset's std) and the label accuracy (the multiset
  overlap) in NumPy; then each row's aggregates and its Markdown cells."""
  res = json.loads((out / "results.json").read_text())
  md = (out / "results.md").read_text()
  threshold = float(re.search(r"success \(PSNR > ([0-9.]+)\)", md).group(1))
  std = np.asarray(res["std"], np.float64)
  assert len(res["table"]) == 2
  for t in res["table"]:
    psnr, paper, ssim, accuracy, gamma = [], [], [], [], []
    for row in t["rows"]:
      kept = np.load(out / "items" / f"{t['method']}_{row['index']}.npz")
      item = json.loads((out / "items" / f"{t['method']}_{row['index']}.json").read_text())
      gt = kept["ground_truth"][0].astype(np.float64)
      rec = np.clip(kept["reconstruction"][0].astype(np.float64), 0, 1)
      psnr.append(skimage.metrics.peak_signal_noise_ratio(gt, rec, data_range=1))
      paper.append(10 * np.log10(1 / np.mean(((rec - gt) * std) ** 2)))
      ssim.append(skimage.metrics.structural_similarity(gt, rec, data_range=1, channel_axis=-1))
      assert item["iterations"] == 2  # SMALL's budget, DLG's row too (its 4000 the default only)
      overlap = collections.Counter(item["labels_reconstructed"]) & collections.Counter(item["labels_true"])
      accuracy.append(sum(overlap.values()) / len(item["labels_true"]))
      if item["gamma"] is not None:  # DLM's learnt scale, as the experiment's results hold it
        gamma.append(item["gamma"])
    assert t.get("gamma_median") == (float(np.median(gamma)) if gamma else None)
    np.testing.assert_allclose([r["psnr"] for r in t["rows"]], psnr, rtol=1e-6)
    np.testing.assert_allclose([r["psnr_paper"] for r in t["rows"]], paper, rtol=1e-6)
    np.testing.assert_allclose([r["ssim"] for r in t["rows"]], ssim, rtol=1e-6)
    psnr, paper = np.array(psnr), np.array(paper)
    want = (np.mean(psnr > threshold), np.mean(paper > threshold), np.mean(psnr), np.median(psnr),
            np.mean(ssim), np.mean(accuracy))
    np.testing.assert_allclose([t["success"], t["success_paper"], t["psnr_mean"], t["psnr_median"],
                                t["ssim_mean"], t["label_accuracy"]], want, rtol=1e-6)
    assert (f"| {t['method']} | {100 * want[0]:.0f} % | {100 * want[1]:.0f} % | {want[2]:.2f} "
            f"({want[3]:.2f}) | {want[4]:.3f} |") in md, md


def _check_text_table(out):
  """text-table's numbers from the sentences it kept, true and recovered, compared word by word:
  position-wise token accuracy (of both decodings), bag recall (the multiset overlap), exact
  sentences; then each row's aggregates and its Markdown cells."""
  res = json.loads((out / "results.json").read_text())
  md = (out / "results.md").read_text()
  for t in res["table"]:
    accuracy, nearest, recall, exact = [], [], [], []
    for row in t["rows"]:
      true = row["sentence"]["true"].split(" ")
      found = row["sentence"]["recovered (pseudo-inverse)"].split(" ")
      assert len(found) == len(true) == res["sequence_length"]
      accuracy.append(np.mean([a == b for a, b in zip(found, true)]))
      near = row["sentence"]["recovered (nearest)"].split(" ")
      nearest.append(np.mean([a == b for a, b in zip(near, true)]))
      recall.append(sum((collections.Counter(found) & collections.Counter(true)).values()) / len(true))
      exact.append(found == true)
    np.testing.assert_allclose([r["token_accuracy"] for r in t["rows"]], accuracy, rtol=1e-9)
    np.testing.assert_allclose([r["token_accuracy_nearest"] for r in t["rows"]], nearest, rtol=1e-9)
    np.testing.assert_allclose([r["bag_recall"] for r in t["rows"]], recall, rtol=1e-9)
    assert [bool(r["exact"]) for r in t["rows"]] == exact
    assert t["exact"] == sum(exact) and len(t["rows"]) == res["count"] == 2
    want = (np.mean(accuracy), np.std(accuracy), np.median(accuracy), np.mean(nearest), np.mean(recall))
    np.testing.assert_allclose([t["token_accuracy_mean"], t["token_accuracy_std"],
                                t["token_accuracy_median"], t["token_accuracy_nearest_mean"],
                                t["bag_recall_mean"]], want, rtol=1e-9)
    assert (f"| {t['search']} | {want[0]:.2f} ± {want[1]:.2f} ({want[2]:.2f}) | {want[3]:.2f} | "
            f"{want[4]:.2f} | {sum(exact)}/2 |") in md, md


# The table programs whose printed numbers the study variants' runs recompute.
TABLE_CHECKS = {"dlm-table": _check_dlm_table, "text-table": _check_text_table}
