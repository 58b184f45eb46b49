"""Reconstruct a client's private images (or, with --modality=text, sentences) from its gradient or update.

With no flags: DLG (Zhu et al., 2019) against DLG's LeNet on a photo bundled with scikit-image.

  gradjax reconstruct
  gradjax reconstruct --attack=idlg --dataset=cifar10 --index=3
  gradjax reconstruct --dataset=mnist --batch_size=2 --iterations=3000
  gradjax reconstruct --weights=W.safetensors --observation=G.safetensors   # captured
  gradjax reconstruct --attack=inverting_gradients --output_dir=runs/ig --resume
  gradjax reconstruct --modality=text --attack=sapag       # a sentence of Python's docs
  gradjax reconstruct --config=inverting_gradients --config.attack.iterations=500

Writes to ``--output_dir`` (default ``runs/<attack>_<model>_<source>``, suffixed when taken; a folder
holding another run is refused unless ``--overwrite``): ``metrics.json`` (psnr, ssim, mse,
label_accuracy when there is a ground truth; wall_time_s, iterations, restarts, the objective and its
history, the configuration, the command as typed, the device, its cores and the versions),
``config.py`` (the resolved configuration: ``--config=<it>`` reproduces the run),
``reconstruction.npy`` ((N, H, W, C) float32 in [0, 1]), ``reconstruction.png``, ``grid.svg``, ``curves.svg`` and ``report.html``. While it runs,
``state.npz`` holds the solver state (saved every ``--save_every_s``); ``--resume`` continues a killed
run from it. Bad flags or data: one-line error, exit code 2.

With ``--modality=text`` the client trains a Transformer language model (``--model=transformer``) on
sentences of a corpus (``--dataset=pydoc``, the default, or ``wikitext2``) and the run writes
``metrics.json`` (token accuracy and bag-of-words recall), ``sentences.txt`` (each recovered sentence
under the true one), ``curves.svg`` and ``report.html``.
"""

import json
import os

from absl import app, flags

from gradjax import verdict
from gradjax.cli import common, distributed
from gradjax.run import config, pipeline, report, resume, text_run

common.define_flags()
common.define_output_flags()
common.define_launch_flags(collectives=True)  # restarts split over processes (--config.execution.shard=True)
flags.adopt_module_key_flags(common)  # --help lists the shared flags too


def _differs_from_finished(out: str, cfg: config.Config) -> list[str]:
  """The flags of the options that determine a reconstruction (:func:`gradjax.run.config.fingerprint`)
  on which ``cfg`` differs from the finished run in ``out`` (its ``metrics.json``'s configuration)."""
  try:
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as fh:
      saved = config.fingerprint(config.from_dict(json.load(fh)["config"]))
  except (OSError, ValueError, KeyError, TypeError):
    return ["its metrics.json holds no readable configuration"]
  mine = config.fingerprint(config.with_declared(cfg))  # as the run recorded it
  return [config.flag(p) for p in mine if mine[p] != saved.get(p)]


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    cfg = common.config_from_flags(check=config.check)
    name = config.run_name(cfg)
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  if distributed.process_count() > 1 and not cfg.execution.shard:
    common.fail(f"{distributed.process_count()} processes run one attack together when its "
                "restarts are split over them: add --config.execution.shard=True")
  out = common.output_folder(name, own=("metrics.json", "reconstruction.*", "model_input.npy", "grid.svg",
                                        "curves.svg", "report.html", "sentences.txt", "config.py"))
  state = common.state_file(out)
  if flags.FLAGS.resume and not os.path.exists(state.path):
    if os.path.exists(os.path.join(out, "metrics.json")):
      differs = _differs_from_finished(out, cfg)
      if differs:
        common.fail(f"--resume: {out} holds a finished run of other options ({', '.join(differs)}); "
                    "run without --resume, in another folder")
      print(f"nothing to resume: {out} holds a finished run (metrics.json)")
      return
    common.fail(f"--resume: {out} holds no saved state ({os.path.basename(state.path)}) to continue; "
                "start afresh there with --overwrite in place of --resume")
  resume.stop_on_signals()  # Ctrl-C or SIGTERM: save after the chunk being run, then stop
  if cfg.data.modality == "text":
    return text_main(cfg, out, state)
  try:
    results, images = pipeline.run(cfg, callback=common.log_progress, state=state)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  except resume.Interrupted as e:
    common.interrupted(e, out)
  if not distributed.is_writer():
    distributed.finished()
    return  # process 0 writes the results
  results = {**results, **common.provenance()}  # the command as typed, the device and its cores
  n = results["num_samples"]
  what = (f"captured {cfg.client.observation} ({n} sample{'' if n == 1 else 's'})"
          if cfg.client.observation else
          f"{cfg.data.dataset}[{cfg.data.index}:{cfg.data.index + cfg.data.batch_size}]")
  title = f"{cfg.attack.preset} on {results['model']}, {what}"
  try:
    report.write_run(out, results, images, title)
    common.write_config(out, cfg)
  except OSError as e:
    common.fail(f"cannot write the results to {out}: {e.strerror or e}; the solver state is kept in "
                f"{state.path}, so --resume --output_dir={out} rewrites them without recomputing")
  state.remove()
  if "psnr" in results:
    # Labels the threat model handed over are the attack's input, not what it recovered.
    shared = (results.get("findings") or {}).get("labels", {}).get("inferred") is False
    scores = (f"PSNR {results['psnr']:.2f} dB  SSIM {results['ssim']:.3f}  "
              + (f"LPIPS {results['lpips']:.3f}  " if results.get("lpips") is not None else "")
              + ("labels not read" if results["label_accuracy"] is None
                 else "labels shared" if shared
                 else f"label accuracy {results['label_accuracy']:.2f}"))
    scores += _separated_psnr(results)
  else:
    scores = (("no objective" if results["loss"] is None else f"objective {results['loss']:.3e}")
              + f"  labels {results['labels_by_slot']} (no ground truth)")
  if results["candidates"] < cfg.attack.permutations:
    scores += f"  ({results['candidates']} label orders exist; all were searched)"
  closed = results["attack"].get("closed_form", {}).get("name")  # the one run (auto's choice too)
  steps = (verdict.closed_form_steps(closed, results["iterations"], pipeline.separated(results))
           if closed else f"{results['iterations']} iterations")
  print(f"{title}: {scores}  {steps}  {results['wall_time_s']:.1f} s"
        + ("  (resumed)" if results["resumed"] else ""))
  print(f"wrote {out}: metrics.json, report.html, reconstruction.npy, model_input.npy, "
        "reconstruction.png, grid.svg" + (", curves.svg" if results.get("history") else "")
        + ", config.py")
  print_verdict(results)


def _separated_psnr(results: dict) -> str:
  """Of a closed form that separated k of N examples (0 < k < N; cocktail_party's k components),
  the mean PSNR of those k: the others are placeholders (grey), whose PSNR the mean over all N
  averages in. The examples it did not separate have label −1 (``labels_reconstructed``, in the
  ground truth's order)."""
  sep = pipeline.separated(results)
  if sep is None or not 0 < sep[0] < sep[1]:
    return ""
  read = [p for p, c in zip(results["psnr_per_image"], results["labels_reconstructed"]) if c >= 0]
  if len(read) != sep[0]:
    return ""
  which = "unmixed" if results.get("cocktail") else "separated"
  return f" (PSNR {sum(read) / len(read):.2f} dB over the {len(read)} {which})"


def print_verdict(results: dict) -> None:
  """What a malicious server would add, the client's DP-SGD guarantee, then ``verdict: <status>:
  <reason>``: the console's last line."""
  if results.get("malicious_server"):
    print(f"malicious server: {results['malicious_server']['reason']}")
  if results.get("privacy"):
    print(f"DP-SGD: {report.privacy_line(results['privacy'])}")
  if results.get("adaptation"):  # what the adapted attack modelled of the defense, and what not
    print(f"adapted: {'; '.join(results['adaptation'])}")
  if results.get("shared_labels_unused"):
    print("labels: the capture declares the client's labels (shared with the server); this attack "
          "optimises its own (--labels=known attacks with the declared ones)")
  print(f"verdict: {results['verdict']['status']}: {results['verdict']['reason']}")


def text_main(cfg, out, state):
  """--modality=text: recover the client's sentences; print them beside the true ones."""
  try:
    results = text_run.run_text(cfg, callback=common.log_progress, state=state)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  except resume.Interrupted as e:
    common.interrupted(e, out)
  if not distributed.is_writer():
    distributed.finished()
    return  # process 0 writes the results
  results = {**results, **common.provenance()}
  title = (f"{cfg.attack.preset} on {results['model']}, {cfg.data.dataset} sentences "
           f"{cfg.data.index}..{cfg.data.index + cfg.data.batch_size - 1}")
  try:
    report.write_text_run(out, results, title)
    common.write_config(out, cfg)
  except OSError as e:
    common.fail(f"cannot write the results to {out}: {e.strerror or e}; the solver state is kept in "
                f"{state.path}, so --resume --output_dir={out} rewrites them without recomputing")
  state.remove()
  print(report.sentence_table(results), end="")
  if "rouge1" in results:  # the span attack: exact sentences, no iterations
    print(f"{title}: {results['exact']} of {cfg.data.batch_size} sentences exact  ROUGE-1 "
          f"{results['rouge1']:.3f}  ROUGE-2 {results['rouge2']:.3f}  token accuracy "
          f"{results['token_accuracy']:.2f}  {results['wall_time_s']:.1f} s")
  else:
    print(f"{title}: token accuracy {results['token_accuracy']:.2f} (nearest "
          f"{results['token_accuracy_nearest']:.2f})  bag recall {results['bag_recall']:.2f}  "
          f"{results['iterations']} iterations  {results['wall_time_s']:.1f} s"
          + ("  (resumed)" if results["resumed"] else ""))
  print(f"wrote {out}: metrics.json, sentences.txt, report.html"
        + (", curves.svg" if results.get("history") else ""))
  print_verdict(results)


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
