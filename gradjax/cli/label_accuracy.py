"""Label-inference accuracy of iDLG over many clients, each attacking a fresh random model.

The iDLG protocol (Zhao et al., 2020): one image per client, a freshly initialised model per run,
label = argmin_c Σ_j ∂L/∂W_last[j, c] (argmax where the head's inputs sum below zero, the sign read
from the bias gradient: :func:`gradjax.labels.idlg`). Models and seeds follow gradjax.run.pipeline, so run ``i`` here
attacks the same model as image ``i`` of a sweep.

  gradjax label-accuracy --dataset=cifar10 --count=50
  gradjax label-accuracy --dataset=mnist --count=1000

Over several processes (the launch flags, :mod:`gradjax.cli.distributed`), client k runs on process
k mod P and process 0 prints and writes the result.
"""

import time

import numpy as np
from absl import app, flags

from gradjax.cli import common, distributed
from gradjax import clients, data, labels
from gradjax.run import pipeline, report

# Images, one at a time, of fresh models (no checkpoint or captured files), each client's FedSGD gradient.
common.define_flags(fields=("data.dataset", "data.data_dir", "data.image_size", "data.channels",
                            "data.normalization", "model.name", "model.init", "model.act",
                            "model.conv", "model.num_classes", "client.train_mode"))
common.define_table_flags(psnr=False)
common.define_results_file_flag()
common.define_launch_flags(collectives=False)  # clients split over processes


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  start = time.perf_counter()
  try:
    cfg = common.config_from_flags()
    common.check_output_file()
    size = None if cfg.data.image_size is None else (cfg.data.image_size, cfg.data.image_size)
    batch = data.load(
        cfg.data.dataset,
        data_dir=cfg.data.data_dir,
        indices=range(f.start, f.start + f.count),
        image_size=size,
        channels=cfg.data.channels)
    x = data.normalize(batch.x, data.normalization(cfg.data.normalization or "none"))
    num_classes = cfg.model.num_classes or batch.num_classes
    correct = {}
    for k in range(distributed.process_index(), f.count, distributed.process_count()):
      index = f.start + k
      key_model = pipeline.experiment_keys(cfg.seed, index).model
      model = cfg.model.build(key_model, batch.x.shape[1:], num_classes)
      obs = clients.fedsgd(model.apply_fn, model.variables, x[k:k + 1], batch.y[k:k + 1],
                           train=cfg.client.train_mode)
      correct[k] = int(labels.idlg(obs)[0]) == int(batch.y[k])
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  shares = distributed.gather(sorted(correct.items()))
  if shares is None:  # not process 0, which prints and writes the result
    distributed.finished()
    return
  correct = [hit for _, hit in sorted(kv for share in shares for kv in share)]
  acc = float(np.mean(correct))
  result = {
      "method": "idlg", "dataset": cfg.data.dataset, "model": cfg.model.name,
      "init": cfg.model.init, "start": f.start, "count": f.count, "accuracy": acc,
      "correct": correct, "wall_time_s": time.perf_counter() - start, **common.provenance()
  }
  if f.output:
    report.save_json(f.output, result)
  print(f"iDLG label accuracy on {cfg.data.dataset}[{f.start}:{f.start + f.count}] with fresh "
        f"{cfg.model.name} models: {acc * 100:.1f} % ({sum(correct)}/{f.count}), "
        f"{result['wall_time_s']:.1f} s")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
