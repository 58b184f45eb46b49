"""Reconstruct a client's private images from its gradient or update.

With no flags: DLG (Zhu et al., 2019) against DLG's LeNet on a photo bundled with scikit-image.

  python experiments/reconstruct.py
  python experiments/reconstruct.py --attack=idlg --dataset=cifar10 --index=3
  python experiments/reconstruct.py --dataset=mnist --batch_size=2 --iterations=3000
  python experiments/reconstruct.py --weights=W.safetensors --observation=G.safetensors   # captured

Writes to ``--output_dir``: ``metrics.json`` (psnr, ssim, mse, label_accuracy when there is a ground
truth; wall_time_s, iterations, restarts, the objective and its history, the configuration and the
JAX device), ``reconstruction.npy`` ((N, H, W, C) float32 in [0, 1]), ``reconstruction.png``,
``grid.png``, ``curves.png`` and ``report.html``. Bad flags or data: one-line error, exit code 2.
"""

import os

from absl import app, flags, logging

import common
from gradjax import pipeline, report

common.define_flags()
flags.DEFINE_string("output_dir", None, "Output folder (default runs/<attack>_<model>_<dataset>_<index>).")


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    cfg = common.config_from_flags()
    results, images = pipeline.run(cfg, callback=common.log_progress)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  if cfg.observation:
    source = os.path.splitext(os.path.basename(cfg.observation))[0]
    what = f"captured {cfg.observation} ({results['num_samples']} samples)"
  else:
    source = f"{cfg.dataset.replace(':', '-')}_{cfg.index}"
    what = f"{cfg.dataset}[{cfg.index}:{cfg.index + cfg.batch_size}]"
  out = flags.FLAGS.output_dir or os.path.join("runs", f"{cfg.attack}_{results['model']}_{source}")
  title = f"{cfg.attack} on {results['model']}, {what}"
  report.write_run(out, results, images, title)
  logging.info("wrote %s", out)
  if "psnr" in results:
    scores = (f"PSNR {results['psnr']:.2f} dB  SSIM {results['ssim']:.3f}  "
              + (f"LPIPS {results['lpips']:.3f}  " if results.get("lpips") is not None else "")
              + f"label accuracy {results['label_accuracy']:.2f}")
  else:
    scores = f"objective {results['loss']:.3e}  labels {results['labels_by_slot']} (no ground truth)"
  print(f"{title}: {scores}  {results['iterations']} iterations  {results['wall_time_s']:.1f} s  -> {out}")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
