"""Attack what a server recorded of a federation (``gradjax.integrations.flower.AuditStrategy`` or any capture
folders of :mod:`gradjax.integrations.audit`): every round and client, with the attacks its metadata support.

  gradjax audit --audit_dir=audit
  gradjax audit --audit_dir=audit --dataset=cifar10 --rounds=1,2   # scored
  gradjax audit --audit_dir=audit --attacks=dlm_plus --iterations=2000

``--attacks=auto`` (default, ``gradjax.auto``): one full-batch local step (a scaled gradient) gets
iDLG for one example and ``inverting_gradients_batch`` for more or on a ConvNet, after a closed
form where the model allows one (``exclusive_neurons`` for a ReLU dense first layer; ``rgap`` for
one example of a ReLU LeNet, then ``inverting_gradients_batch``); several steps get the replayed local training (Inverting Gradients' FedAvg attack)
and DLM+; an unknown schedule gets DLM+. With ``--dataset``, captures whose client
reported its ``data_indices`` are scored (PSNR, SSIM, LPIPS). Writes per capture and attack
``<round>/<client>/<attack>/`` (metrics.json, reconstruction.npy, report.html, ...; ``<attack>-1``,
``-2``, ... where an earlier audit wrote that one: never replaced) and over the
federation ``index.json``, ``index.md`` and ``index.html``. A malformed capture or a failing attack
is a row with its error, and the program then ends with one line and exit code 1 once the index
is written; bad flags or a --dataset that cannot be loaded: one-line error, exit code 2. The index
merges with an earlier one in the folder: rows of rounds not attacked again are kept. The first
Ctrl-C or SIGTERM stops the audit after the capture being attacked: the index holds the captures
done, one line names the command that continues (``--resume``: captures whose ``rows.json`` holds
rows of the same options are read back), exit code 128 + the signal (130 for Ctrl-C); a second
Ctrl-C stops the capture being attacked at once, the index and the line as after the first.

Over several processes (the launch flags, :mod:`gradjax.cli.distributed`; every process sees the
recorded folder): capture k is attacked by process k mod P, each writing its captures' run folders,
and process 0 writes the index of all of them.

Options: those of ``gradjax.run.config`` that attacking captured files takes (``--config=<file>`` sets
them too; ``--print_config`` shows them): ``--model`` and ``--normalization`` default to the
captures' metadata (``--model`` names the model of captures that do not; one that contradicts a
capture's is refused), ``--dataset`` to no scoring, unless given; with ``--iterations`` unset DLG and
iDLG run 6000 iterations (their papers' whole budget), the other attacks their preset's.
"""

import os
import sys
import tempfile

from absl import app, flags

from gradjax.cli import common, distributed
from gradjax import auto, data, interop
from gradjax.integrations import audit
from gradjax.run import config, pipeline, report, resume

flags.DEFINE_string("audit_dir", None, "The recorded federation (round_*/client_* capture folders).")
ATTACKS = audit.ATTACKS
flags.DEFINE_string("attacks", "auto", f"Comma-separated attacks ({', '.join(ATTACKS)}) or auto.")
flags.DEFINE_string("rounds", None, "Comma-separated rounds to attack (default: all).")
flags.DEFINE_bool("resume", False, common.RESUME_HELP)  # captures with rows.json of the same options
# The options of the schema it reads (gradjax.run.config), as for any captured files: --model and
# --normalization default to the captures' metadata, --dataset (scoring) to none.
common.define_flags(fields=audit.OPTIONS, captured=True)
common.define_launch_flags(collectives=False)  # captures split over processes
flags.adopt_module_key_flags(common)


def _stopped(e: audit.Stopped, found, settings: audit.Settings, rounds) -> None:
  """One line for an audit a signal stopped, naming the command that continues it; the index holds
  the captures attacked so far (process 0 of a run over several processes: its own); exit code
  128 + the signal's number."""
  line = (f"interrupted after {e.done} of {e.total} captures; resume with: "
          f"{common.resume_command(None)}")
  if distributed.process_count() > 1:  # the others stop too
    distributed.fail(line, 128 + e.signum)
  if e.rows:
    audit.index(flags.FLAGS.audit_dir, e.rows, settings, found, rounds=rounds)
  print(line, file=sys.stderr)
  sys.exit(128 + e.signum)


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  if not f.audit_dir:
    common.fail("--audit_dir is required")
  common.refuse_a_sweep("attacks the recorded captures")
  names = tuple(a.strip() for a in f.attacks.split(","))
  unknown = [a for a in names if a != auto.AUTO and a not in ATTACKS]
  if (not all(names) or unknown or len(set(names)) != len(names)
      or (auto.AUTO in names and len(names) > 1)):
    common.fail(f"--attacks takes 'auto' or distinct names from {', '.join(ATTACKS)}; got {f.attacks!r}")
  try:
    o = common.options_from_flags()
  except ValueError as e:
    common.fail(str(e))
  common.print_config(o)
  if o["attack.restarts"] < 1 or (o["attack.iterations"] is not None and
                                  o["attack.iterations"] < 1):
    common.fail("--restarts and --iterations must be positive")
  try:
    if o["data.normalization"] is not None:
      data.normalization(o["data.normalization"])
    # What every capture's run would refuse alike, refused once here (before any row is replaced).
    settings = audit.settings(names, {p: o[p] for p in audit.OPTIONS})
    if o["model.rename"] is not None:
      interop.parse_renames(o["model.rename"])
    sample = None
    if o["data.dataset"]:  # asked for: it must load, or every score would be blank
      size = o["data.image_size"]
      sample = data.load(o["data.dataset"], data_dir=o["data.data_dir"], indices=[0],
                         image_size=None if size is None else (size, size))
  except (ValueError, FileNotFoundError) as e:
    common.fail(f"--dataset={o['data.dataset']}: {e}"
                if o["data.dataset"] and "normalization" not in str(e) else str(e))
  try:
    rounds = None if f.rounds is None else [int(r) for r in f.rounds.split(",")]
  except ValueError:
    common.fail(f"--rounds takes comma-separated integers, got {f.rounds!r}")
  try:
    found = audit.select(f.audit_dir, rounds)
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  if sample is not None:  # the scores compare images of the captures' shape
    for c in found:
      declared = (c.info.get("metadata") or {}).get("input_shape")
      try:
        declared = None if declared is None else tuple(int(v) for v in (
            interop.parse_shape(declared) if isinstance(declared, str) else declared))
      except (ValueError, TypeError):
        continue  # the capture's own row says what is wrong with it
      if declared is not None and declared != tuple(sample.x.shape[1:]):
        common.fail(f"--dataset={o['data.dataset']} gives {tuple(sample.x.shape[1:])} images; round "
                    f"{c.round} client {c.client} declares input_shape {declared} (--image_size sets "
                    "the size)")
  if o["model.name"] is not None:  # named for captures that do not name their model
    for c in found:
      declared = (c.info.get("metadata") or {}).get("model")
      if isinstance(declared, str) and declared and declared != o["model.name"]:
        common.fail(f"--model={o['model.name']}, but round {c.round} client {c.client} declares "
                    f"model {declared} (--model names the model of captures that do not); drop it")
  for name in ("index.json", "index.md", "index.html"):  # before any attack, not after them all
    if os.path.isdir(os.path.join(f.audit_dir, name)):
      common.fail(f"{os.path.join(f.audit_dir, name)} is a folder where the audit writes its index; "
                  "move it away")
  try:  # the index is written there after every attack: found unwritable now, not then
    with tempfile.TemporaryFile(dir=f.audit_dir):
      pass
  except OSError as e:
    common.fail(f"cannot write the audit's index into {f.audit_dir}: {e.strerror or e}")
  count, me = distributed.process_count(), distributed.process_index()
  resume.stop_on_signals()  # the first Ctrl-C or SIGTERM stops after the capture being attacked
  try:  # process k: captures k, k + P, ...
    rows = audit.attack_captures(found[me::count], settings, resume=f.resume,
                                 stop=resume.stop_requested)
  except audit.Stopped as e:
    _stopped(e, found, settings, rounds)
  shares = distributed.gather(rows)
  if shares is None:  # not process 0, which writes the index
    distributed.finished()
    print(f"process {me}: attacked {len(found[me::count])} of {len(found)} captures; process 0 "
          "writes the index")
    return
  try:
    rows = audit.index(f.audit_dir, [r for share in shares for r in share], settings, found,
                       rounds=rounds)
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  print(audit.index_markdown(rows))
  print(f"Wrote {f.audit_dir}/index.html, index.md and index.json.")
  if settings.defense.dp_sgd() is not None:  # every client's, as the options say
    privacy = pipeline.dp_sgd_privacy(config.Config(defense=settings.defense))
    print(f"DP-SGD: {report.privacy_line(privacy)}")
  failed = audit.failed_rows(rows)
  if failed:  # written, and still not a success: a failed client or attack is never silent
    print(f"error: {len(failed)} of {len(rows)} rows failed (first: round {failed[0]['round']} "
          f"client {failed[0]['client']}: {failed[0]['error']})", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
