"""Train a model (FedSGD or FedAvg, optionally under a defense) and save a checkpoint after every epoch.

  gradjax train                      # lenet_zhu on scikit-image's lfw_subset (no data folder needed)
  gradjax train --dataset=mnist --model=mlp --config.training.train_count=2000 --config.training.test_count=1000 --epochs=3
  gradjax train --modality=text --epochs=1 --config.training.lr=0.1   # the Transformer on Python's docs
  gradjax train --dataset=mnist --client=fedavg --config.training.clients=10 --epochs=5 --config.client.local_epochs=1 \\
      --config.client.local_batch_size=20 --config.client.local_lr=0.05 --defense=clip:1.0,gaussian:1e-6
  gradjax train --model=resnet20 --dataset=cifar10_train --config.training.train_count=50000 \\
      --config.training.test_dataset=cifar10 --config.training.test_count=1017 --config.client.train_mode=True --batch_size=128 --config.training.lr=0.1 --epochs=5

Data: the images of ``--dataset`` are permuted with ``--config.training.data_seed`` (``--config.training.data_seed=-1`` keeps the file
order); the first ``--config.training.train_count`` train the model and the following ``--config.training.test_count`` measure its
accuracy. The indices of both sets (into the source) are in results.json. The bundled data folder holds
the *test* splits of MNIST and CIFAR (MNIST's 10000, CIFAR-10's first 1017) and CIFAR-10's 50000
training images as JPEG (``cifar10_train``); with ``--config.training.test_dataset`` the test images are the first
``--config.training.test_count`` of that dataset instead (e.g. train on ``cifar10_train``, test on ``cifar10``). The default dataset, ``lfw_subset`` (scikit-image's 200
25×25 face / non-face patches, sorted by class, hence the permutation), needs no data folder;
scikit-learn's ``digits`` would be the natural default but needs scikit-learn.

Training (gradjax.training): ``--client=fedsgd``: ``--epochs`` passes of shuffled mini-batches of
``--batch_size``, SGD with ``--config.training.lr``, ``--config.training.momentum`` (``--config.training.nesterov=True``) and ``--config.training.weight_decay``, the learning
rate multiplied by ``--config.training.lr_gamma`` after each epoch of ``--config.training.lr_milestones``, the defense on every step's
gradient (the decay is added after it: it is the client's optimiser, not what it shares); ``--config.training.augment=True``
crops and flips every batch's images afresh. Inverting Gradients' recipe for its trained models
(``inversefed``'s "conservative" strategy) is ``--batch_size=128 --config.training.lr=0.1 --config.training.momentum=0.9 --config.training.nesterov=True
--config.training.weight_decay=5e-4 --epochs=120 --config.training.lr_milestones=44,75,105 --config.training.augment=True``.
``--client=fedavg``: ``--epochs`` rounds; the training images are cut into ``--config.training.clients`` equal shards,
each client trains ``--config.client.local_epochs`` with ``--config.client.local_batch_size`` and ``--config.client.local_lr`` and the defense acts
on each client's update. Inputs are normalised by ``--normalization`` (per-channel mean and std, e.g.
``cifar10``, Inverting Gradients' input space; ``none`` by default), which the checkpoint's metadata
keep, so an attack on the checkpoint must name the same ``--normalization``. The model runs
in evaluation mode (BatchNorm statistics stay at their initial values) unless ``--config.client.train_mode=True`` (FedSGD
only): then BatchNorm normalises by each mini-batch and its running statistics are trained, as a
BatchNorm network is normally trained; GradInversion's and HFGInv's BatchNorm prior needs them.

``--modality=text`` trains a language model (``--model=transformer``, SAPAG's sizes unless
``--config.model.text_*`` say otherwise) on a corpus (``--dataset=pydoc``, Python's Language Reference as the
standard library ships it, or ``wikitext2``): the corpus is one stream of tokens, each sentence
followed by ``<eos>``, cut into windows of ``--config.data.sequence_length`` (gradjax.corpus.windows); the last
tenth of the (permuted) windows are the test set unless ``--config.training.train_count`` / ``--config.training.test_count`` are given,
and the accuracy is next-token accuracy. The checkpoint's metadata hold the vocabulary, so
``gradjax reconstruct --modality=text --checkpoint=...`` attacks with the same token ids.

Options: the data, model, client (FedAvg's local training), defense and training sections of
``gradjax.run.config``; the defaults are ``gradjax/configs/train.py`` (``--print_config`` shows them,
``--config=<file>`` reads others). Writes to ``--output_dir``: ``epoch_{E}.npz`` for E = 0 (the
initial model) .. epochs, with metadata that rebuild the model (``gradjax.checkpoint.load_model``),
``config.py`` (``--config=`` it trains the same model again) and ``results.json`` (per-epoch test
accuracy and training loss, the configuration, wall time). Bad flags or data: one-line error, exit 2.
"""

import os
import time

import jax
import numpy as np
from absl import app, flags, logging

from gradjax.cli import common
from gradjax import checkpoint, clients, corpus, data, models, training
from gradjax.run import config, report

# The options of the schema it reads (gradjax.run.config): data, model, client (FedAvg's local
# training), defense, training and seed; its default configuration is gradjax/configs/train.py.
common.define_flags(
    default_config="train",
    sections=("data", "model", "client", "defense", "training"),
    omit=("data.index", "data.min_length", "model.checkpoint", "model.weights", "model.rename",
          "model.num_classes",
          "client.shared_labels", "client.observation", "client.num_samples", "client.force"))
common.define_output_flags(resumable=False)
flags.adopt_module_key_flags(common)


def load_split(f):
  """The train/test split of the configuration's dataset (gradjax.training.split), normalised by
  --normalization."""
  parts = _load_split(f)
  if _normalization(f) == "none":
    return parts
  norm = data.normalization(_normalization(f))
  return parts._replace(train=parts.train._replace(x=data.normalize(parts.train.x, norm)),
                        test=parts.test._replace(x=data.normalize(parts.test.x, norm)))


def _normalization(f) -> str:
  return f.data.normalization or "none"


def _load_split(f):
  """The configuration's dataset split as loaded, before normalisation."""
  size = None if f.data.image_size is None else (f.data.image_size, f.data.image_size)
  seed = common.permutation_seed(f.training.data_seed, "config.training.data_seed")
  test_count = f.training.test_count if f.training.test_dataset is None else 0
  parts = training.load_split(f.data.dataset, f.training.train_count, test_count, seed,
                              data_dir=f.data.data_dir, image_size=size, channels=f.data.channels)
  if f.training.test_dataset is None:
    return parts
  test = data.load(
      f.training.test_dataset,
      data_dir=f.data.data_dir,
      indices=range(f.training.test_count),
      image_size=size,
      channels=f.data.channels) if f.training.test_count else parts.test
  if test.x.shape[1:] != parts.train.x.shape[1:] or test.num_classes != parts.train.num_classes:
    raise ValueError(
        f"--config.training.test_dataset={f.training.test_dataset} gives {test.x.shape[1:]} images of "
        f"{test.num_classes} classes, --dataset={f.data.dataset} {parts.train.x.shape[1:]} of "
        f"{parts.train.num_classes}")
  return parts._replace(test=test, test_indices=np.arange(len(test.x)))


def load_text_split(f):
  """(split, vocabulary) of --modality=text: the corpus's windows (gradjax.corpus.windows), the last
  tenth for testing unless --config.training.train_count / --config.training.test_count say otherwise (None: not given). A masked
  language model's vocabulary adds <mask>, and each window has 15 % of its positions masked
  (gradjax.corpus.masked_lm_pairs, drawn once from --config.training.data_seed, 0 for -1: the same masks every
  epoch, where BERT draws new ones)."""
  sentences = corpus.sentences(f.data.dataset, f.data.data_dir)
  vocabulary = corpus.Vocabulary.build(sentences, f.data.vocab_size)
  x, y = corpus.windows(sentences, vocabulary, f.data.sequence_length)
  if models.is_masked_lm(f.model.name or ""):
    vocabulary = vocabulary.with_mask()
    x, y = corpus.masked_lm_pairs(x, vocabulary.mask, 0.15, seed=max(f.training.data_seed, 0))
  test = f.training.test_count if f.training.test_count is not None else len(x) // 10
  train = f.training.train_count if f.training.train_count is not None else len(x) - test
  ds = data.Dataset(x, y, len(vocabulary), f.data.dataset)
  return training.split(ds, train, test, common.permutation_seed(
      f.training.data_seed, "config.training.data_seed")), vocabulary


def fmt(accuracy):
  return "n/a" if accuracy is None else f"{accuracy:.4f}"


def _conv(name: str) -> str:
  """``--config.model.conv``, with auto: split on CPU (the epoch's lax.scan runs XLA's transposed convolutions
  as slow loop nests there) and XLA's own convolutions on accelerators."""
  if name != "auto":
    return name
  return "split" if jax.default_backend() == "cpu" else "xla"


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  common.refuse_a_sweep()
  values = common.option_values()
  if values["data.modality"] == "text" and values["client.name"] != "fedsgd":
    common.fail(f"gradjax train trains a text model with FedSGD steps (--client=fedsgd); "
                f"--client={values['client.name']} is for images")
  try:
    f = common.config_from_flags()
  except ValueError as e:
    common.fail(str(e))
  given = common.options_given()
  if f.data.modality == "text" and f.data.dataset not in corpus.CORPORA:
    common.fail(f"--modality=text trains a text model ({', '.join(models.TEXT_MODELS)}) on a corpus "
                f"({', '.join(corpus.CORPORA)}), not {f.model.name} on {f.data.dataset}")
  if f.client.name == "fedsgd" and f.training.clients != 1:
    common.fail("--config.training.clients is for --client=fedavg (FedSGD trains on one batch per step)")
  if f.client.train_mode and f.client.name != "fedsgd":
    common.fail("--config.client.train_mode=True is for --client=fedsgd (FedAvg clients train in evaluation mode)")
  if f.client.share_statistics:
    common.fail("--config.client.share_statistics=True is for attacks (a simulated client that sends "
                "its BatchNorm statistics); train saves the statistics in every checkpoint")
  if f.training.test_dataset is not None and f.data.modality == "text":
    common.fail("--config.training.test_dataset is for images (text tests on held-out windows of the corpus)")
  if f.training.test_dataset is not None and f.training.test_dataset == f.data.dataset:
    common.fail(f"--config.training.test_dataset={f.training.test_dataset} is the training set: its "
                "first images would be training images; leave it unset (the images after the "
                "training ones test) or name another split")
  if _normalization(f) != "none" and f.data.modality == "text":
    common.fail("--normalization is for images (text is token ids)")
  if (f.client.name == "fedavg" and f.training.train_count is not None and f.training.clients >= 1
      and f.training.train_count % f.training.clients):
    common.fail(f"--config.training.train_count={f.training.train_count} does not cut into "
                f"--config.training.clients={f.training.clients} equal shards: "
                f"{f.training.train_count % f.training.clients} images would never train")
  if f.client.name == "fedavg" and not 1 <= f.training.clients <= f.training.train_count:
    common.fail(
        f"--config.training.clients must be in [1, --config.training.train_count = {f.training.train_count}], got {f.training.clients}"
    )
  ignored = [config.flag(path) for path in config.unread_by_client(f.client.name, given)]
  if ignored:
    common.fail(f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply to --client={f.client.name}")
  if f.training.augment and f.data.modality == "text":
    common.fail("--config.training.augment=True is for images (text windows are not cropped or flipped)")
  milestones = ()
  if f.client.name == "fedsgd":
    try:
      training.check_sgd(
          f.data.batch_size if f.training.train_count is None else f.training.train_count,
          f.training.epochs, f.data.batch_size, f.training.lr, f.training.momentum,
          f.training.weight_decay, f.training.nesterov,
          names={"epochs": "--epochs", "batch_size": "--batch_size",
                 "learning_rate": "--config.training.lr", "momentum": "--config.training.momentum",
                 "weight_decay": "--config.training.weight_decay",
                 "nesterov": "--config.training.nesterov=True"})
    except ValueError as e:
      common.fail(str(e))
    try:
      milestones = tuple(int(m) for m in f.training.lr_milestones.split(",") if m.strip())
    except ValueError:
      common.fail("--config.training.lr_milestones must be comma-separated epochs, got "
                  f"{f.training.lr_milestones!r}")
    try:
      if milestones:
        training.step_decay(f.training.lr, milestones, 1, f.training.lr_gamma)
    except ValueError as e:
      common.fail(f"--config.training.lr_milestones, --config.training.lr_gamma: {e}")
    if milestones and max(milestones) >= f.training.epochs:
      common.fail(f"--config.training.lr_milestones {f.training.lr_milestones} lie after the last "
                  f"of --epochs={f.training.epochs} (the rate changes after each milestone's epoch)")
    if not milestones and "training.lr_gamma" in given:
      common.fail("--config.training.lr_gamma multiplies the rate at --config.training.lr_milestones: "
                  "give them too")
  try:
    common.permutation_seed(f.training.data_seed, "config.training.data_seed")
    f.defense.build()
    if f.defense.dp_sgd() is not None:
      raise ValueError("--config.defense.dp_sgd_max_norm simulates one client's DP-SGD update for "
                       "an attack (gradjax reconstruct, sweep); gradjax train applies --defense to its "
                       "updates, not DP-SGD's per-example clipping")
    if f.data.modality == "text" and f.data.tokenizer != "words":
      raise ValueError("gradjax train reads the corpus's words: --config.data.tokenizer=bpe:N learns its pieces "
                       "on the corpus an attack reads, which a checkpoint's vocabulary cannot follow")
  except ValueError as e:
    common.fail(str(e))
  out = common.output_folder(
      f"train_{f.model.name}_{f.data.dataset.replace(':', '-')}_{f.client.name}",
      own=("epoch_*.npz", "results.json", "config.py"))
  start = time.perf_counter()
  try:
    defense = f.defense.build()
    text_meta = {}
    if f.data.modality == "text":
      parts, vocabulary = load_text_split(f)
      text_meta = {"vocabulary": list(vocabulary.tokens), "sequence_length": f.data.sequence_length,
                   "text_sizes": f.model.text_sizes()._asdict()}
    else:
      parts = load_split(f)
    input_shape = tuple(int(d) for d in parts.train.x.shape[1:])
    metadata = {
        "model": f.model.name, "init": f.model.init, "act": f.model.act,
        "num_classes": parts.train.num_classes, "input_shape": list(input_shape),
        "param_dtype": "float32", "normalization": _normalization(f), "dataset": f.data.dataset,
        "image_size": f.data.image_size, "channels": f.data.channels,
        "train_count": len(parts.train.x), "test_count": len(parts.test.x
                                                            ), "data_seed": f.training.data_seed,
        "client": f.client.name, "defense": f.defense.spec or "none", "seed": f.seed,
        "train_mode": f.client.train_mode, "test_dataset": f.training.test_dataset, **text_meta
    }
    model_key, train_key = jax.random.split(jax.random.key(f.seed))
    model = checkpoint.model_from_metadata(
        metadata,
        model_key,  # what load_model rebuilds
        **({} if f.data.modality == "text" else {"conv": _conv(f.model.conv)}))
    if f.client.train_mode and "batch_stats" not in model.variables:
      raise ValueError(f"--config.client.train_mode=True updates BatchNorm statistics, which "
                       f"{f.model.name} has none of")
    local = f.client.local_training()
    if f.client.name == "fedavg":
      clients.check_local_training(local, f.training.train_count // f.training.clients)
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  common.write_config(out, f)
  x_test, y_test = parts.test.x, parts.test.y

  def accuracy(variables):
    return training.evaluate(model.apply_fn, variables, x_test, y_test) if len(x_test) else None

  def save(epoch, variables, step, acc):
    checkpoint.save(os.path.join(out, f"epoch_{epoch}.npz"), variables,
                    {**metadata, "epoch": epoch, "step": step, "accuracy": acc})

  acc0 = accuracy(model.variables)
  save(0, model.variables, 0, acc0)
  history = [{"epoch": 0, "accuracy": acc0}]
  print(f"epoch 0  test accuracy {fmt(acc0)}")

  def callback(epoch, variables, record):
    acc = accuracy(variables)
    save(epoch, variables, record.get("steps", epoch), acc)
    loss = record.get("train_loss")
    print(
        f"epoch {epoch}/{f.training.epochs}  " +
        (f"train loss {loss:.4f}  " if loss is not None else "") +
        f"test accuracy {fmt(acc)}  ({record['time_s']:.1f} s)",
        flush=True)
    return {"epoch": epoch, "accuracy": acc}

  try:
    if f.client.name == "fedsgd":
      steps = len(parts.train.x) // f.data.batch_size
      lr = training.step_decay(f.training.lr, milestones, steps,
                               f.training.lr_gamma) if milestones else f.training.lr
      black = data.normalize(np.zeros(parts.train.x.shape[-1]), data.normalization(_normalization(f)))
      augmentation = training.Augmentation(4, True, tuple(black)) if f.training.augment else None
      _, records = training.train_fedsgd(
          model.apply_fn, model.variables, parts.train.x, parts.train.y, key=train_key,
          epochs=f.training.epochs, batch_size=f.data.batch_size, learning_rate=lr,
          momentum=f.training.momentum, weight_decay=f.training.weight_decay,
          nesterov=f.training.nesterov, defense=defense, train_mode=f.client.train_mode,
          augmentation=augmentation, callback=callback)
    else:
      _, records = training.train_fedavg(
          model.apply_fn, model.variables, parts.train.x, parts.train.y, key=train_key,
          rounds=f.training.epochs, clients=f.training.clients, local=local, defense=defense,
          callback=callback)
  except (ValueError, FloatingPointError) as e:
    common.fail(str(e))
  history += records
  wall = time.perf_counter() - start
  report.save_json(
      os.path.join(out, "results.json"), {
          "config": config.record(f, tuple(common.FIELDS)), "metadata": metadata,
          "history": history, "wall_time_s": wall, **common.provenance(),
          "train_indices": parts.train_indices, "test_indices": parts.test_indices
      })
  logging.info("wrote %s", out)
  print(
      f"{f.model.name} on {f.data.dataset} ({len(parts.train.x)} train / {len(parts.test.x)} test), {f.client.name}, "
      f"defense {f.defense.spec or 'none'}: test accuracy {fmt(history[-1]['accuracy'])}  {wall:.1f} s  -> {out}"
  )


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
