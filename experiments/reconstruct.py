"""Reconstruct a client's private images from its FedSGD gradient.

With no flags: DLG (Zhu et al., 2019) against DLG's LeNet on a photo bundled with scikit-image.

  python experiments/reconstruct.py
  python experiments/reconstruct.py --attack=idlg --dataset=cifar10 --index=3
  python experiments/reconstruct.py --dataset=mnist --batch_size=2 --iterations=3000

Writes ``metrics.json`` (psnr, ssim, mse, label_accuracy, wall_time_s, iterations, restarts, the
configuration and the JAX device) and ``reconstruction.png`` (ground truth above, reconstruction below)
to ``--output_dir``. Bad flags or data: one-line error, exit code 2.
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
  out = flags.FLAGS.output_dir or os.path.join(
      "runs", f"{cfg.attack}_{cfg.model}_{cfg.dataset.replace(':', '-')}_{cfg.index}")
  report.save_json(os.path.join(out, "metrics.json"), results)
  grid = report.image_grid([images["ground_truth"], images["reconstruction"]])
  report.save_png(os.path.join(out, "reconstruction.png"), grid)
  logging.info("wrote %s", out)
  print(f"{cfg.attack} on {results['model']}, {cfg.dataset}[{cfg.index}:{cfg.index + cfg.batch_size}]: "
        f"PSNR {results['psnr']:.2f} dB  SSIM {results['ssim']:.3f}  "
        f"label accuracy {results['label_accuracy']:.2f}  {results['iterations']} iterations  "
        f"{results['wall_time_s']:.1f} s  -> {out}")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
